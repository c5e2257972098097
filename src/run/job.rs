//! A run as its phases hand it on: what it was asked (`Job`), and once its folder is taken
//! (`Opened`). The phases (model, steps, finish) all read these, so they live below them.

use super::options::{GivenSettings, RunOptions};
use super::resume::StartedWith;
use super::{EngineSettings, extend, folder};
use crate::cluster::Ranks;
use crate::record::{Manifest, RunFolder};
use crate::scenarios::{self, Registry};
use std::path::PathBuf;

/// A run as its phases take it on: what it was asked, and the engine settings resolved so far.
pub(super) struct Job<'a> {
    pub(super) registry: &'a Registry,
    pub(super) options: RunOptions,
    pub(super) ranks: &'a Ranks,
    pub(super) given: GivenSettings,
    pub(super) engine: EngineSettings,
}

/// A run with its folder taken: the experiment, the folder (rank 0's), its manifest, and
/// what a resumed run started with.
pub(super) struct Opened {
    pub(super) dir: PathBuf,
    pub(super) loaded: Box<dyn scenarios::Loaded>,
    /// A new run's folder, given up if the run fails before its first step.
    pub(super) starting: folder::Starting,
    /// A resumed run's folder, its records: kept whatever happens.
    pub(super) resumed_folder: Option<RunFolder>,
    /// The folder once the steps begin (locked while the run holds it).
    pub(super) kept: Option<RunFolder>,
    pub(super) manifest: Manifest,
    pub(super) started: Option<StartedWith>,
    pub(super) resume: bool,
    pub(super) extension: Option<extend::MovedAside>,
}
