//! The study's figures, for every arm and population: intervals over replicate means, as
//! in the tables.

use super::data::{Cell, Run};
use super::quantities::{mix, profit, share, weighted};
use crate::analysis::plot::{Band, FigureFolder, Grid, Lines, Network, PlotError};
use crate::analysis::stats::{Method, Summary};
use crate::record;
use crate::scenarios::energy_market::Row;
use crate::scenarios::energy_market::config::Role;
use std::collections::BTreeMap;
use std::path::Path;

/// Panels per row of a grid.
const COLUMNS: usize = 3;

/// A point with its interval (the mean alone when there is none).
fn point(x: f64, s: Summary) -> (f64, f64, f64, f64) {
    let (lo, hi) = s.interval().unwrap_or((s.mean, s.mean));
    (x, s.mean, lo, hi)
}

/// Over the shown steps, per replicate the mean of `f` over the companies `keep` selects
/// among those present; the series' points are the replicate-level summaries.
fn series(
    cells: &[&Cell],
    name: String,
    from_market: bool,
    keep: &dyn Fn(&Cell, &Row) -> bool,
    f: &dyn Fn(&Row) -> f64,
    method: Method,
) -> Band {
    let steps: Vec<usize> = cells
        .first()
        .map(|c| c.shown_steps().filter(|&s| !from_market || s > 0).collect())
        .unwrap_or_default();
    let points = steps
        .into_iter()
        .filter_map(|s| {
            let means: Vec<f64> = cells
                .iter()
                .filter(|c| s <= c.last_step())
                .filter_map(|c| {
                    let v: Vec<f64> = c.steps[s]
                        .iter()
                        .filter(|r| c.present(s, r.agent) && keep(c, r))
                        .map(f)
                        .collect();
                    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
                })
                .collect();
            Summary::with(method, &means).map(|m| point(s as f64, m))
        })
        .collect();
    Band { name, points }
}

fn utilities_of(persona: String) -> impl Fn(&Cell, &Row) -> bool {
    move |_, r| r.role == Role::Utility && r.persona == persona
}

fn title_of(run: &Run, arm: &str, population: usize) -> String {
    match (run.arms.len() > 1, run.populations.len() > 1) {
        (true, true) => format!("arm {arm}, {population} companies"),
        (true, false) => format!("arm {arm}"),
        (false, _) => format!("{population} companies"),
    }
}

/// Utilities by persona over time, a panel per arm and population.
fn persona_grid(run: &Run, title: &str, y: &str, f: fn(&Row) -> f64, method: Method) -> Grid {
    let mut panels = Vec::new();
    for (arm, population) in run.groups() {
        let cells = run.group(&arm, population);
        panels.push(Lines {
            title: format!("{title}: {}", title_of(run, &arm, population)),
            x_label: "step".into(),
            y_label: y.into(),
            series: super::measures::personas_of(&cells)
                .into_iter()
                .map(|p| series(&cells, p.clone(), true, &utilities_of(p), &f, method))
                .collect(),
            markers: false,
        });
    }
    Grid {
        columns: run.populations.len().clamp(1, COLUMNS),
        panels,
    }
}

/// Figure 7's data: each persona's utility profit per step, a panel per arm and population,
/// each point the mean and interval over replicate means of the utilities trading in that
/// step (a company's last point is the step that bankrupted it).
pub fn profit_by_persona(run: &Run) -> Grid {
    persona_grid(
        run,
        "Figure 7: utility profit by persona",
        "profit per step",
        profit,
        Method::StudentT,
    )
}

/// Draws every figure into `dir`; returns their names.
pub fn draw(run: &Run, dir: &Path) -> Result<Vec<String>, PlotError> {
    let mut folder = FigureFolder::into(dir);
    // Figure 2: the network of the first cell.
    if let Some(cell) = &run.first_network {
        let fig = network_figure(cell);
        folder.save("fig2_network", &fig)?;
    }
    let fig = consumer_price(run);
    folder.save("fig3_consumer_price", &fig)?;
    let fig = bankruptcies(run);
    folder.save("fig3b_bankruptcies", &fig)?;
    let fig = producer_prices(run);
    folder.save("fig4_producer_prices", &fig)?;
    let fig = step_time(run);
    folder.save("fig5_step_time", &fig)?;
    let fig = subpopulations(run);
    folder.save("fig6_subpopulations", &fig)?;
    // Figures 7 to 9: utilities by persona over time, a panel per arm and population.
    let fig = profit_by_persona(run);
    folder.save("fig7_profit_by_persona", &fig)?;
    let fig = persona_grid(
        run,
        "Figure 8: renewable preference by persona",
        "adjust_renewable_mix",
        mix,
        Method::BootstrapPercentile,
    );
    folder.save("fig8_renewable_preference", &fig)?;
    let fig = renewable_fraction(run);
    folder.save("fig9_renewable_fraction", &fig)?;
    Ok(folder.names())
}

/// A grid of a panel per population, each with `lines` of every arm.
fn per_population(
    run: &Run,
    title: &str,
    y: &str,
    lines: &dyn Fn(&str, &[&Cell]) -> Vec<Band>,
) -> Grid {
    Grid {
        columns: run.populations.len().clamp(1, COLUMNS),
        panels: run
            .populations
            .iter()
            .map(|&population| Lines {
                title: format!("{title} ({population} companies)"),
                x_label: "step".into(),
                y_label: y.into(),
                series: run
                    .arms
                    .iter()
                    .flat_map(|arm| lines(arm, &run.group(arm, population)))
                    .collect(),
                markers: false,
            })
            .collect(),
    }
}

/// Figure 3: consumer price over time, a panel per population, a line per arm.
fn consumer_price(run: &Run) -> Grid {
    per_population(
        run,
        "Figure 3: price to consumers, utilities trading (mean, 95% CI over replicates)",
        "price per unit",
        &|arm, cells| {
            vec![series(
                cells,
                arm.to_string(),
                false,
                &|_, r| r.role == Role::Utility,
                &|r| r.cost_to_consumer,
                Method::BootstrapPercentile,
            )]
        },
    )
}

/// Bankruptcies over time, as their own series: the share of each role's companies bankrupt.
fn bankruptcies(run: &Run) -> Grid {
    per_population(
        run,
        "Bankruptcies: share of companies bankrupt",
        "share bankrupt",
        &|arm, cells| {
            [Role::Utility, Role::Producer]
                .into_iter()
                .map(|role| {
                    let name = match role {
                        Role::Utility => format!("{arm}: utilities"),
                        Role::Producer => format!("{arm}: producers"),
                    };
                    // Every company, bankrupt or not: the share is over all of them.
                    let steps: Vec<usize> = cells
                        .first()
                        .map(|c| c.shown_steps().collect())
                        .unwrap_or_default();
                    Band {
                        name,
                        points: steps
                            .into_iter()
                            .filter_map(|s| {
                                let shares: Vec<f64> = cells
                                    .iter()
                                    .filter(|c| s <= c.last_step())
                                    .filter_map(|c| {
                                        let of: Vec<&Row> =
                                            c.steps[s].iter().filter(|r| r.role == role).collect();
                                        (!of.is_empty()).then(|| {
                                            of.iter().filter(|r| r.bankrupt).count() as f64
                                                / of.len() as f64
                                        })
                                    })
                                    .collect();
                                Summary::of_bounded(&shares).map(|m| point(s as f64, m))
                            })
                            .collect(),
                    }
                })
                .collect()
        },
    )
}

/// Figure 4: every producer's price in the first replicate of the first arm, a panel per
/// population; a bankrupt producer's line ends at the step that bankrupted it.
fn producer_prices(run: &Run) -> Grid {
    let first_arm = run.arms.first().cloned().unwrap_or_default();
    Grid {
        columns: run.populations.len().clamp(1, COLUMNS),
        panels: run
            .populations
            .iter()
            .filter_map(|&population| {
                let cell = *run.group(&first_arm, population).first()?;
                let mut lines: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
                for s in cell.shown_steps() {
                    for r in cell.present_rows(s, Role::Producer) {
                        lines
                            .entry(r.agent)
                            .or_default()
                            .push((s as f64, r.energy_price));
                    }
                }
                Some(Lines {
                    title: format!(
                        "Figure 4: producer prices, arm {first_arm}, replicate {}, {population} companies",
                        cell.replicate
                    ),
                    x_label: "step".into(),
                    y_label: "price per unit".into(),
                    series: lines
                        .into_iter()
                        .take(24)
                        .map(|(a, pts)| {
                            let kind = &cell.steps[0][a].company_type;
                            let end = match cell.bankrupt_at(a) {
                                Some(s) => format!(" (bankrupt at {s})"),
                                None => String::new(),
                            };
                            Band::line(format!("{kind} {a}{end}"), pts)
                        })
                        .collect(),
                    markers: false,
                })
            })
            .collect(),
    }
}

/// Figure 5: time per step against population, a line per number of devices.
fn step_time(run: &Run) -> Lines {
    let mut by_ranks: BTreeMap<usize, BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
    for s in &run.steps {
        by_ranks
            .entry(s.ranks)
            .or_default()
            .entry(s.population)
            .or_default()
            .push(s.seconds);
    }
    let devices = match by_ranks.keys().collect::<Vec<_>>()[..] {
        [1] => ", 1 device".to_string(),
        [r] => format!(", {r} devices"),
        _ => String::new(),
    };
    Lines {
        title: format!(
            "Figure 5: time per step ({} policy{devices}; mean, 95% CI over steps)",
            run.manifest.policy
        ),
        x_label: "companies".into(),
        y_label: "seconds per step".into(),
        series: by_ranks
            .into_iter()
            .map(|(ranks, pops)| Band {
                name: format!("{ranks} device{}", if ranks == 1 { "" } else { "s" }),
                points: pops
                    .into_iter()
                    .filter_map(|(p, s)| Summary::of_bounded(&s).map(|m| point(p as f64, m)))
                    .collect(),
            })
            .collect(),
        markers: true,
    }
}

/// Figure 6: each producer type's mean price (second half of the run) against population,
/// one line per type, interval over replicates.
fn subpopulations(run: &Run) -> Lines {
    let first_arm = run.arms.first().cloned().unwrap_or_default();
    let mut per_type: BTreeMap<String, Vec<(f64, f64, f64, f64)>> = BTreeMap::new();
    for &population in &run.populations {
        let cells = run.group(&first_arm, population);
        if cells.is_empty() {
            continue;
        }
        for t in super::measures::type_stats(&cells).0 {
            if let Some(s) = t.price.replicates {
                per_type
                    .entry(t.company_type)
                    .or_default()
                    .push(point(population as f64, s));
            }
        }
    }
    Lines {
        title: format!(
            "Figure 6: mean producer price by type against population, arm {first_arm} (95% CI over replicates)"
        ),
        x_label: "companies".into(),
        y_label: "price per unit (second half of the run)".into(),
        series: per_type
            .into_iter()
            .map(|(name, points)| Band { name, points })
            .collect(),
        markers: true,
    }
}

/// Figure 9 as the study defines it (the renewable share weighted by the preference),
/// beside the unweighted share.
fn renewable_fraction(run: &Run) -> Grid {
    let weighted_grid = persona_grid(
        run,
        "Figure 9: renewable share x preference",
        "renewable share x adjust_renewable_mix",
        weighted,
        Method::BootstrapPercentile,
    );
    let share_grid = persona_grid(
        run,
        "Renewable share of purchases",
        "renewable share",
        share,
        Method::BootstrapPercentile,
    );
    Grid {
        columns: 2,
        panels: weighted_grid
            .panels
            .into_iter()
            .zip(share_grid.panels)
            .flat_map(|(a, b)| [a, b])
            .collect(),
    }
}

/// The most companies Figure 2 draws: past a few hundred, a drawn network is a blot (and at
/// 200,000 companies it was a 117 MB SVG).
const NETWORK_DRAWN: usize = 250;

/// Figure 2 for one cell: its whole network, or, for a large market, company 0's
/// neighbourhood (breadth first: its links, their links, ...) up to [`NETWORK_DRAWN`]
/// companies with the links among them, the title saying so.
fn network_figure(cell: &record::CellRecord) -> Network {
    let key = format!("{}/{}/{}", cell.arm, cell.population, cell.replicate);
    let companies = cell.world["companies"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let n = companies.len();
    let links = |i: usize| -> Vec<usize> {
        companies[i]["links"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|v| v.as_u64())
                    .map(|v| v as usize)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut chosen: Vec<usize> = Vec::new();
    let mut index = vec![usize::MAX; n];
    let mut queue = std::collections::VecDeque::new();
    let mut visit =
        |i: usize, chosen: &mut Vec<usize>, queue: &mut std::collections::VecDeque<usize>| {
            if i < n && index[i] == usize::MAX && chosen.len() < NETWORK_DRAWN {
                index[i] = chosen.len();
                chosen.push(i);
                queue.push_back(i);
            }
        };
    for start in 0..n {
        // Company 0 first; then any part of the network it does not reach.
        visit(start, &mut chosen, &mut queue);
        while let Some(i) = queue.pop_front() {
            for j in links(i) {
                visit(j, &mut chosen, &mut queue);
            }
        }
        if chosen.len() >= NETWORK_DRAWN.min(n) {
            break;
        }
    }
    // Drawn in id order, whichever were chosen.
    chosen.sort_unstable();
    for (k, &i) in chosen.iter().enumerate() {
        index[i] = k;
    }
    let nodes = chosen
        .iter()
        .map(|&i| {
            let c = &companies[i];
            (
                c["id"].to_string(),
                c["type"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    let index = &index;
    let edges = chosen
        .iter()
        .flat_map(|&i| {
            links(i)
                .into_iter()
                .filter(|&j| j < n && index[j] != usize::MAX)
                .map(move |j| (index[i], index[j]))
        })
        .collect();
    let title = if chosen.len() < n {
        format!(
            "Figure 2: the market's network ({key}): {} of {n} companies, company 0's neighbourhood (breadth first)",
            chosen.len()
        )
    } else {
        format!("Figure 2: the market's network ({key})")
    };
    Network {
        title,
        nodes,
        edges,
    }
}
