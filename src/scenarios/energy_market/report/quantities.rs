//! What the report measures of one company's row.

use crate::scenarios::energy_market::Row;

/// A row's quantities, as the figures and the tests read them.
pub fn profit(r: &Row) -> f64 {
    r.profit
}
pub fn mix(r: &Row) -> f64 {
    r.renewable_mix
}
pub fn share(r: &Row) -> f64 {
    r.renewable_fraction
}
pub fn weighted(r: &Row) -> f64 {
    r.renewable_fraction * r.renewable_mix
}

/// A utility's value in one step.
pub(crate) type Quantity = fn(&Row) -> f64;

/// The persona quantities the tests compare, by the name the tests carry.
pub(crate) const QUANTITIES: [(&str, Quantity); 3] = [
    ("utility profit", profit),
    ("renewable mix", mix),
    ("renewable share", share),
];
