//! One attribute of every agent of a cell, as a column.

use std::sync::Arc;

/// One attribute of every agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// Category index per agent.
    Categorical {
        categories: Arc<[String]>,
        codes: Vec<u16>,
    },
    Numeric {
        values: Vec<f32>,
        /// Whether its values are whole numbers (`integer = true`): kept exactly in the
        /// floats, and handed to Python as ints.
        integer: bool,
    },
}
