//! The game's own records: each round's row of `aggregates.csv`, and a grouped game's
//! `group_rounds` table.

use crate::record;
use arrow_array::RecordBatch;
use arrow_schema::FieldRef;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// One cell's round in `aggregates.csv` (after the cell's keys, which the runner writes; the
/// step is the round, 1-based).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Round {
    pub players: usize,
    /// Players who guessed (the others' replies fell back).
    pub guesses: usize,
    pub mean: Option<f64>,
    pub median: Option<f64>,
    pub std: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub target: Option<f64>,
    /// The guess closest to the target; the lower one when guesses on both sides of the
    /// target are equally close.
    pub winning_number: Option<f64>,
    /// The higher winning guess when guesses on both sides of the target are equally close
    /// (empty otherwise): those agents win too, and count in `winners`.
    #[serde(default)]
    pub tied_winning_number: Option<f64>,
    /// Agents who guessed a winning number.
    pub winners: usize,
    /// The number best responses converge to from any start, when there is one (see
    /// `TargetRule::equilibrium`; empty for ratio 1 without offset, and for a ratio above 1
    /// whose unstable crossing splits play between 0 and 100).
    pub equilibrium: Option<f64>,
}

/// A round as read back, with its cell's keys.
pub type RoundRow = record::Keyed<Round>;

pub(crate) fn round_batch(rows: &[Round]) -> RecordBatch {
    use serde_arrow::schema::{SchemaLike, TracingOptions};
    static FIELDS: OnceLock<Vec<FieldRef>> = OnceLock::new();
    let fields = FIELDS.get_or_init(|| {
        Vec::<FieldRef>::from_type::<Round>(TracingOptions::default().allow_null_fields(true))
            .expect("invariant: the row type traces")
    });
    serde_arrow::to_record_batch(fields, &rows).expect("invariant: rows fit their schema")
}

/// The rounds of a grouped game, one row per group: `group_rounds.parquet`.
pub const GROUP_ROUNDS: &str = "group_rounds";

/// One group's round of a grouped game.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupRound {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub step: usize,
    pub level: String,
    pub group: usize,
    pub players: usize,
    pub guesses: usize,
    pub mean: Option<f64>,
    pub target: Option<f64>,
    pub winning_number: Option<f64>,
    pub winners: usize,
}
