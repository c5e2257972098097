//! Why a plan could not be made, in a file of its own so that every phase of the plan names
//! it without importing the module that runs them.

use super::device::PlacementError;
use crate::run::RunError;

/// Why a plan could not be made: what a run would refuse (its config, its model, its
/// options), or models that cannot be placed on the devices given.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Boxed: a run's error is large, and a plan's functions return this on every path.
    #[error(transparent)]
    Run(Box<RunError>),
    #[error(transparent)]
    Placement(#[from] PlacementError),
}

/// The errors of the parts a plan runs, each as the run would report it.
macro_rules! as_run_error {
    ($($error:ty),*) => {$(
        impl From<$error> for PlanError {
            fn from(e: $error) -> Self {
                PlanError::Run(Box::new(e.into()))
            }
        }
    )*};
}
as_run_error!(
    RunError,
    std::io::Error,
    crate::sim::config::ConfigError,
    crate::sim::footprint::SizeError,
    crate::sim::runner::SimError,
    crate::model::ModelError,
    crate::engine::EngineError
);
