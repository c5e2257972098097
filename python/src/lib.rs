//! The extension module `throng._throng`, which the Python package `throng` wraps: the
//! engine ([`engine`]), runs and their records ([`runs`]), and scenarios written in Python
//! ([`scenario`]). Like the command line, it is an edge over the library: throng's errors
//! become Python exceptions here ([`errors`]).

mod args;
mod columns;
mod engine;
mod errors;
mod run_options;
mod runs;
mod scenario;

use pyo3::create_exception;
use pyo3::prelude::*;

create_exception!(
    _throng,
    ScenarioProblem,
    errors::ConfigError,
    "A scenario's knob or population that its class refuses: ScenarioProblem(field, message)."
);
create_exception!(
    _throng,
    Rejected,
    errors::ThrongError,
    "A model's reply that `parse` refuses: Rejected(field, reason); the agent keeps `no_change`."
);

/// The `throng` command, the package's console script: throng's command line over `argv` (the
/// command's name first) with the scenarios throng ships and the Python scenario `classes`, as
/// the `throng` binary runs it; returns its exit status.
#[pyfunction]
#[pyo3(signature = (argv, classes = Vec::new()))]
fn main(
    py: Python<'_>,
    argv: Vec<std::ffi::OsString>,
    classes: Vec<Bound<'_, PyAny>>,
) -> PyResult<u8> {
    let registry = runs::registry(&classes)?;
    Ok(py.detach(|| throng::cli::main_with_args(&registry, argv)))
}

#[pymodule]
fn _throng(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_MODEL", throng::model::DEFAULT_MODEL)?;
    m.add_class::<engine::PyEngine>()?;
    m.add_class::<engine::Stream>()?;
    m.add_class::<scenario::PyPopulation>()?;
    m.add_class::<scenario::PyRng>()?;
    m.add_function(wrap_pyfunction!(runs::run, m)?)?;
    m.add_function(wrap_pyfunction!(runs::read_table, m)?)?;
    m.add_function(wrap_pyfunction!(runs::has_table, m)?)?;
    m.add_function(wrap_pyfunction!(runs::verify, m)?)?;
    m.add_function(wrap_pyfunction!(runs::report, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add("ThrongError", py.get_type::<errors::ThrongError>())?;
    m.add("ModelError", py.get_type::<errors::ModelError>())?;
    m.add("RequestError", py.get_type::<errors::RequestError>())?;
    m.add("SchemaError", py.get_type::<errors::SchemaError>())?;
    m.add(
        "PromptTooLongError",
        py.get_type::<errors::PromptTooLongError>(),
    )?;
    m.add("CutOffError", py.get_type::<errors::CutOffError>())?;
    m.add("ArgumentError", errors::argument_error(py)?)?;
    m.add("ConfigError", py.get_type::<errors::ConfigError>())?;
    m.add("RunError", py.get_type::<errors::RunError>())?;
    m.add("ScenarioProblem", py.get_type::<ScenarioProblem>())?;
    m.add("Rejected", py.get_type::<Rejected>())?;
    Ok(())
}
