//! A study's own per-step measures (`aggregates.csv`, a row per cell and step) in the base
//! report: each numeric column's mean per step over the replicates, by arm and population,
//! with its 95% interval, as a table on the page, in `summary.json` (`aggregates`) and as a
//! figure. The state table's columns are means over agents; these are the study's own
//! numbers of a whole cell (a market's price, a round's winning number).

use super::ReportError;
use super::column_figures::mean_figure;
use super::format::slug;
use super::html;
use super::means::{Mean, means, table_html};
use super::state;
use crate::record;
use std::fmt::Write;
use std::path::Path;

/// The means of a run's aggregates, and their figures.
#[derive(Debug, Default)]
pub(super) struct Aggregates {
    pub means: Vec<Mean>,
    /// Their figures, paths under the run folder without extension.
    pub figures: Vec<String>,
    /// Columns whose Student's t intervals were cut at 0.
    pub cut: Vec<String>,
}

/// The aggregates of the run in `dir`, with their figures drawn; `None` when the run keeps
/// none or has not finished a step.
pub(super) fn read(dir: &Path) -> Result<Option<Aggregates>, ReportError> {
    let path = dir.join(record::AGGREGATES);
    if !path.exists() {
        return Ok(None);
    }
    let table = state::aggregates(&path)?;
    if table.step.is_empty() || table.numbers.is_empty() {
        return Ok(None);
    }
    let (means, cut) = means(&table);
    let last_step = table.step.iter().copied().max().unwrap_or(0) as usize;
    let columns: Vec<String> = table.numbers.iter().map(|(n, _)| n.clone()).collect();
    let figures_dir = dir.join("figures");
    std::fs::create_dir_all(&figures_dir)?;
    let figures = columns
        .iter()
        .map(|column| {
            mean_figure(
                &figures_dir,
                &means,
                column,
                &format!("aggregate_{}", slug(column)),
                &format!("{column} (aggregates.csv): mean per step, 95% interval over replicates"),
                last_step,
            )
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(Aggregates {
        means,
        figures,
        cut,
    }))
}

impl Aggregates {
    /// The means at `step`, one row per arm, population and column.
    pub fn at(&self, step: usize) -> impl Iterator<Item = &Mean> {
        self.means.iter().filter(move |m| m.step == step)
    }

    /// The page's section: the means at the last step and every column's figure.
    pub fn html(&self, last_step: usize) -> String {
        let mut body = format!(
            "<h2>The study's own measures at step {last_step}</h2><p>From \
             <code>aggregates.csv</code> (a row per cell and step): the mean over replicates, \
             95% interval over replicates.</p>"
        );
        body.push_str(&table_html(self.at(last_step)));
        if !self.figures.is_empty() {
            let _ = write!(body, "{}", html::figures(&self.figures));
        }
        body
    }
}
