//! A run's records, indexed for the report: each cell's rows by step and agent, its trades
//! by step, its arm's settings, and who was in the market when.
//!
//! A company is counted in the statistics of every step it traded in, including the step
//! whose loss bankrupted it (the fixed rules mark it bankrupt in that very step): it traded
//! in step `s` if it was not bankrupt after step `s - 1`.

use super::super::config::{Role, Rules};
pub use super::super::settings::CellSettings;
use super::super::{Row, TRADES, Trade};
use crate::analysis::ReportError;
use crate::record::{self, Manifest, RecordError};
use std::collections::BTreeMap;
use std::path::Path;

/// One cell's records.
#[derive(Debug, Clone)]
pub struct Cell {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub settings: CellSettings,
    /// `steps[s][agent]`: every company after step `s` (0: before anyone moved).
    pub steps: Vec<Vec<Row>>,
    /// `trades[s]`: the purchases of step `s`.
    pub trades: Vec<Vec<Trade>>,
}

impl Cell {
    pub fn last_step(&self) -> usize {
        self.steps.len().saturating_sub(1)
    }

    /// The first step of the market proper: 2 when step 1 was the reference's hidden
    /// round, which the published code's results leave out, as the report does.
    pub(crate) fn first_market_step(&self) -> usize {
        if self.settings.hidden_round { 2 } else { 1 }
    }

    /// The steps the market ran, after any hidden round.
    pub(crate) fn market_steps(&self) -> std::ops::RangeInclusive<usize> {
        self.first_market_step()..=self.last_step()
    }

    /// The steps a report shows over time: the start, then the market's steps.
    pub(crate) fn shown_steps(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(0).chain(self.market_steps())
    }

    /// Whether `agent` traded in `step` (>= 1): it was not bankrupt before it.
    pub fn traded(&self, step: usize, agent: usize) -> bool {
        step >= 1 && step < self.steps.len() && !self.steps[step - 1][agent].bankrupt
    }

    /// Whether `agent` was in the market at `step`: trading in it, or, at step 0, there.
    pub fn present(&self, step: usize, agent: usize) -> bool {
        step == 0 || self.traded(step, agent)
    }

    /// The rows of `role` present at `step`.
    pub(crate) fn present_rows(&self, step: usize, role: Role) -> impl Iterator<Item = &Row> + '_ {
        self.steps[step]
            .iter()
            .filter(move |r| r.role == role && self.present(step, r.agent))
    }

    /// The step in which `agent` went bankrupt, if it did.
    pub(crate) fn bankrupt_at(&self, agent: usize) -> Option<usize> {
        (1..self.steps.len()).find(|&s| self.steps[s][agent].bankrupt)
    }

    /// Units utilities bought from `producer` in `step` (its sales, whatever the rules pay
    /// for).
    pub fn sales(&self, step: usize, producer: usize) -> f64 {
        self.trades
            .get(step)
            .map(|t| {
                t.iter()
                    .filter(|t| t.producer == producer)
                    .map(|t| t.units)
                    .sum()
            })
            .unwrap_or(0.0)
    }

    /// How many steps after a price change its buyers first react: the fixed rules clear on
    /// this step's prices, the reference's on last step's.
    pub(crate) fn response_delay(&self) -> usize {
        match self.settings.rules {
            Rules::Fixed => 0,
            Rules::Reference => 1,
        }
    }
}

/// A run's records.
#[derive(Debug)]
pub struct Run {
    pub manifest: Manifest,
    /// By arm (in the manifest's order), population and replicate.
    pub cells: Vec<Cell>,
    pub arms: Vec<String>,
    pub populations: Vec<usize>,
    /// The first cell's fixed data (`cells.jsonl`): its network.
    pub first_network: Option<record::CellRecord>,
    pub steps: Vec<record::StepRecord>,
}

impl Run {
    pub fn read(dir: &Path) -> Result<Self, ReportError> {
        let manifest: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
        let batches = record::read_state(dir)?;
        let rows: Vec<Row> = record::rows_of(&batches, dir)?;
        drop(batches);
        if rows.is_empty() {
            return Err(ReportError::Empty {
                dir: dir.to_path_buf(),
                what: "state rows",
            });
        }
        // Runs from before the trades table, or without a single purchase, have none; one
        // that is damaged, or gone since the run wrote it, is refused like the state.
        let trades: Vec<Trade> = match record::has_table(dir, TRADES) {
            true => {
                let batches = record::read_table(dir, TRADES)?;
                record::rows_of(&batches, dir)?
            }
            false => Vec::new(),
        };
        let steps = record::read_steps(dir)?;
        let described_cells = record::read_cells(dir, usize::MAX)?;
        let first_network = described_cells.first().cloned();
        let described: BTreeMap<String, serde_json::Value> = described_cells
            .into_iter()
            .map(|c| {
                (
                    format!("{}/{}/{}", c.arm, c.population, c.replicate),
                    c.world,
                )
            })
            .collect();

        type Key = (String, usize, usize);
        let mut by_cell: BTreeMap<Key, Vec<Row>> = BTreeMap::new();
        for r in rows {
            by_cell
                .entry((r.arm.clone(), r.population, r.replicate))
                .or_default()
                .push(r);
        }
        let mut trades_by_cell: BTreeMap<Key, Vec<Trade>> = BTreeMap::new();
        for t in trades {
            trades_by_cell
                .entry((t.arm.clone(), t.population, t.replicate))
                .or_default()
                .push(t);
        }
        let mut arms = manifest.arms.clone();
        for (arm, ..) in by_cell.keys() {
            if !arms.contains(arm) {
                arms.push(arm.clone());
            }
        }
        let mut cells = Vec::new();
        for ((arm, population, replicate), rows) in by_cell {
            let key = format!("{arm}/{population}/{replicate}");
            let settings = described
                .get(&key)
                .and_then(|d| d.get("market"))
                .map(|m| serde_json::from_value(m.clone()))
                .transpose()
                // Named as the run folder names it, as the message always has.
                .map_err(|e| {
                    RecordError::format(Path::new(record::CELLS), format!("cell {key}: {e}"))
                })?
                .unwrap_or_default();
            let last = rows.iter().map(|r| r.step).max().unwrap_or(0);
            let agents = rows.iter().map(|r| r.agent).max().unwrap_or(0) + 1;
            let mut steps: Vec<Vec<Option<Row>>> = vec![vec![None; agents]; last + 1];
            for r in rows {
                let (s, a) = (r.step, r.agent);
                steps[s][a] = Some(r);
            }
            let steps = steps
                .into_iter()
                .enumerate()
                .map(|(s, agents)| {
                    agents
                        .into_iter()
                        .enumerate()
                        .map(|(a, r)| {
                            r.ok_or_else(|| ReportError::MissingRow {
                                table: "state",
                                cell: key.clone(),
                                role: "company",
                                agent: a,
                                step: s,
                            })
                        })
                        .collect::<Result<Vec<Row>, _>>()
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut trades = vec![Vec::new(); last + 1];
            for t in trades_by_cell
                .remove(&(arm.clone(), population, replicate))
                .unwrap_or_default()
            {
                if let Some(step) = trades.get_mut(t.step) {
                    step.push(t);
                }
            }
            cells.push(Cell {
                arm,
                population,
                replicate,
                settings,
                steps,
                trades,
            });
        }
        cells.sort_by_key(|c| {
            (
                arms.iter().position(|a| *a == c.arm),
                c.population,
                c.replicate,
            )
        });
        let mut populations: Vec<usize> = cells.iter().map(|c| c.population).collect();
        populations.sort_unstable();
        populations.dedup();
        Ok(Self {
            manifest,
            cells,
            arms,
            populations,
            first_network,
            steps,
        })
    }

    /// The replicates of one arm at one population size.
    pub fn group(&self, arm: &str, population: usize) -> Vec<&Cell> {
        self.cells
            .iter()
            .filter(|c| c.arm == arm && c.population == population)
            .collect()
    }

    /// Every (arm, population) that has records, arms first.
    pub fn groups(&self) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        for arm in &self.arms {
            for &p in &self.populations {
                if self
                    .cells
                    .iter()
                    .any(|c| &c.arm == arm && c.population == p)
                {
                    out.push((arm.clone(), p));
                }
            }
        }
        out
    }

    /// The first arm whose prompts carry no personas: the control the others are tested
    /// against.
    pub(crate) fn control_arm(&self) -> Option<&str> {
        self.arms
            .iter()
            .find(|a| {
                self.cells
                    .iter()
                    .any(|c| &c.arm == *a && !c.settings.use_personas)
            })
            .map(String::as_str)
    }
}
