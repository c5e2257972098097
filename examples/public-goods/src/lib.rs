//! A public-goods game in nested groups, written outside throng on its public API.
//!
//! Every round each citizen splits an endowment between a private account, the pot of its
//! *local* group (a team) and the pot of its *global* group (the village its team belongs
//! to). Each pot is multiplied by its level's factor and shared equally among the level's
//! members; what a citizen keeps privately is its own. With `1 < factor < members` at each
//! level, contributing is collectively best and individually costly: the linear
//! voluntary-contribution mechanism (Isaac, Walker and Thomas 1984; Ledyard 1995 surveys it),
//! here with a local and a global public good as in Blackwell and McKee (2003), "Only for my
//! own neighborhood? Preferences and voluntary provision of local and global public goods",
//! and Fellner and Lünser (2014), "Cooperation in local and global groups".
//!
//! The scripted baseline follows Fischbacher, Gächter and Fehr (2001), "Are people
//! conditionally cooperative?": about half of people are conditional cooperators (they give
//! about what the others of their group gave, a little less), about a third free riders, and
//! some "hump-shaped" contributors who match low contributions and give less as others give
//! more. First-round contributions sit near half the endowment (Ledyard 1995).
//!
//! The groups come from the config's `[[population.groups]]` (teams of a size, villages of
//! teams, regions by an attribute...); the scenario names which level is local and which
//! global. The levels' pots are computed in [`Scenario::react`], innermost first: a team's
//! pot settles before its village's.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use throng::prelude::*;
use throng::{minijinja, serde_json, toml};

/// The scenario's knobs (`[scenario]` of a config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Knobs {
    /// Tokens each citizen splits every round (Fehr and Gächter 2000 used 20).
    pub endowment: u32,
    /// The group level whose pot is local (a `[[population.groups]]` level's name).
    pub local: String,
    /// The group level whose pot is global; it must enclose `local`.
    pub global: String,
    /// What the local pot is multiplied by before it is shared among the local group.
    pub local_factor: f64,
    /// The same for the global pot.
    pub global_factor: f64,
    /// Of scripted citizens, the shares of free riders and hump-shaped contributors; the
    /// rest cooperate conditionally (Fischbacher, Gächter and Fehr 2001: 30% and 14%).
    pub free_riders: f64,
    pub hump_shaped: f64,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            endowment: 20,
            local: "team".into(),
            global: "village".into(),
            local_factor: 1.6,
            global_factor: 4.0,
            free_riders: 0.3,
            hump_shaped: 0.14,
        }
    }
}

/// A scripted citizen's disposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Conditional,
    FreeRider,
    HumpShaped,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Conditional => "conditional",
            Kind::FreeRider => "free_rider",
            Kind::HumpShaped => "hump_shaped",
        }
    }
}

/// The two pots, in decisions and records.
pub const POTS: [&str; 2] = ["local", "global"];

/// A citizen's split of one round: tokens to the local and the global pot (the rest is
/// kept).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub local: u32,
    pub global: u32,
}

/// Each level's state: per group, last round's pot and what each member got from it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pots {
    pub total: Vec<f64>,
    pub share: Vec<f64>,
}

/// A cell's world.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Commons {
    pub round: usize,
    pub kind: Vec<Kind>,
    /// Last round, per citizen.
    pub local: Vec<u32>,
    pub global: Vec<u32>,
    pub payoff: Vec<f64>,
    pub earnings: Vec<f64>,
    /// Per group level of the population (innermost first), its pots; levels without a pot
    /// keep empty ones.
    pub levels: Vec<Pots>,
}

/// One citizen after a round: a row of the state table (after throng's keys: arm, step,
/// agent, each group level, the attributes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub kind: String,
    pub local: f64,
    pub global: f64,
    pub private: f64,
    pub payoff: f64,
    pub earnings: f64,
}

/// The scenario: one arm's knobs, with the level indices they name filled in at the first
/// world (the population's groups are known only then).
#[derive(Debug, Clone)]
pub struct PublicGoods {
    pub knobs: Knobs,
    schema: Arc<Value>,
}

impl PublicGoods {
    pub fn new(knobs: Knobs) -> Self {
        let e = knobs.endowment;
        let schema = Arc::new(json!({
            "type": "object",
            "properties": {
                "local": {"type": "integer", "minimum": 0, "maximum": e},
                "global": {"type": "integer", "minimum": 0, "maximum": e},
            },
            "required": ["local", "global"],
            "additionalProperties": false,
        }));
        Self { knobs, schema }
    }

    /// The local and global levels' indices among the population's levels.
    fn levels(&self, population: &Population) -> (usize, usize) {
        let at = |name: &str| {
            population
                .groups
                .levels
                .iter()
                .position(|l| l.name == name)
                .expect("invariant: check_population found both levels")
        };
        (at(&self.knobs.local), at(&self.knobs.global))
    }

    /// The mean contribution to a pot by the other members of `agent`'s group at `level`
    /// last round (what a conditional cooperator answers).
    fn others_mean(
        population: &Population,
        level: usize,
        agent: usize,
        given: &[u32],
        pots: &Pots,
    ) -> Option<f64> {
        let g = population.groups.levels[level].of_agent[agent] as usize;
        let n = population.groups.levels[level].sizes[g] as f64;
        (n > 1.0 && !pots.total.is_empty())
            .then(|| (pots.total[g] - given[agent] as f64) / (n - 1.0))
    }
}

fn problem(field: &str, message: String) -> ScenarioProblem {
    ScenarioProblem::new(field, message)
}

impl Scenario for PublicGoods {
    type World = Commons;
    type Decision = Decision;
    type Row = Row;

    const NAME: &'static str = "public_goods";

    fn roles() -> &'static [&'static str] {
        &["citizen"]
    }

    fn from_table(table: &toml::Table) -> Result<Self, ScenarioProblem> {
        let knobs: Knobs = ScenarioProblem::parse(table)?;
        if !(1..=1000).contains(&knobs.endowment) {
            return Err(problem(
                "endowment",
                format!("{}: give 1 to 1000 tokens", knobs.endowment),
            ));
        }
        for (field, factor) in [
            ("local_factor", knobs.local_factor),
            ("global_factor", knobs.global_factor),
        ] {
            if !(factor.is_finite() && factor > 0.0 && factor <= 1000.0) {
                return Err(problem(
                    field,
                    format!("{factor}: a pot's factor is a number above 0 (at most 1000)"),
                ));
            }
        }
        for (field, share) in [
            ("free_riders", knobs.free_riders),
            ("hump_shaped", knobs.hump_shaped),
        ] {
            if !(0.0..=1.0).contains(&share) {
                return Err(problem(field, format!("{share}: a share is within 0 to 1")));
            }
        }
        if knobs.free_riders + knobs.hump_shaped > 1.0 {
            return Err(problem(
                "hump_shaped",
                format!(
                    "free_riders + hump_shaped = {}: the two shares leave no room for \
                     conditional cooperators; keep their sum at most 1",
                    knobs.free_riders + knobs.hump_shaped
                ),
            ));
        }
        Ok(Self::new(knobs))
    }

    fn check_population(
        &self,
        population: &PopulationSpec,
        _sizes: &[usize],
    ) -> Result<(), ScenarioProblem> {
        let names: Vec<&str> = population.groups.iter().map(|l| l.name.as_str()).collect();
        let at = |field: &str, name: &str| {
            names.iter().position(|n| *n == name).ok_or_else(|| {
                problem(
                    field,
                    format!(
                        "`{name}` is not a group level: describe the levels under \
                         [[population.groups]] (levels here: {})",
                        if names.is_empty() {
                            "none".to_string()
                        } else {
                            names.join(", ")
                        }
                    ),
                )
            })
        };
        let local = at("local", &self.knobs.local)?;
        let global = at("global", &self.knobs.global)?;
        if global <= local {
            return Err(problem(
                "global",
                format!(
                    "`{}` must enclose `{}`: list the local level first under \
                     [[population.groups]] (innermost first)",
                    self.knobs.global, self.knobs.local
                ),
            ));
        }
        Ok(())
    }

    fn init(&self, population: &Population, rng: &mut ChaCha8Rng) -> Commons {
        let n = population.size;
        let kind = (0..n)
            .map(|_| {
                let u: f64 = rng.random();
                if u < self.knobs.free_riders {
                    Kind::FreeRider
                } else if u < self.knobs.free_riders + self.knobs.hump_shaped {
                    Kind::HumpShaped
                } else {
                    Kind::Conditional
                }
            })
            .collect();
        Commons {
            round: 0,
            kind,
            local: vec![0; n],
            global: vec![0; n],
            payoff: vec![0.0; n],
            earnings: vec![0.0; n],
            levels: vec![Pots::default(); population.groups.levels.len()],
        }
    }

    fn num_agents(&self, world: &Commons) -> usize {
        world.kind.len()
    }

    /// The rules, the same for every citizen of a cell: first in every prompt, so that the
    /// prefix cache computes them once.
    fn shared_context(&self, world: &Commons, step: usize) -> minijinja::Value {
        let k = &self.knobs;
        minijinja::context! {
            round => step + 1,
            rounds_played => world.round,
            endowment => k.endowment,
            local => k.local.clone(),
            global => k.global.clone(),
            local_factor => k.local_factor,
            global_factor => k.global_factor,
        }
    }

    /// The citizen's groups and their results last round, outermost first (shared by the
    /// members of a group, so the prefix cache serves them too), then its own.
    fn turn(&self, world: &Commons, population: &Population, agent: usize, step: usize) -> Turn {
        let groups: Vec<Value> = population
            .groups
            .path(agent)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .map(|(l, g)| {
                let level = &population.groups.levels[l];
                let pots = &world.levels[l];
                let size = level.sizes[g] as f64;
                json!({
                    "level": level.name,
                    "label": level.labels[g],
                    "members": level.sizes[g],
                    "pot": pots.total.get(g),
                    "average": pots.total.get(g).map(|t| t / size),
                    "share": pots.share.get(g),
                })
            })
            .collect();
        Turn {
            context: minijinja::context! {
                round => step + 1,
                groups => minijinja::Value::from(minijinja::value::Serde(&groups)),
                played => world.round > 0,
                local => world.local[agent],
                global => world.global[agent],
                kept => self.knobs.endowment - world.local[agent] - world.global[agent],
                payoff => world.payoff[agent],
                earnings => world.earnings[agent],
                profile => population
                    .profile(agent)
                    .map(|(name, value)| format!("{name}: {value}"))
                    .collect::<Vec<_>>(),
            },
            schema: self.schema.clone(),
        }
    }

    /// A reply that gives more than the endowment in all is scaled down to it (the global
    /// pot first), and says so.
    fn parse(
        &self,
        _world: &Commons,
        _agent: usize,
        value: &Value,
    ) -> Result<Parsed<Decision>, ParseError> {
        let mut d: Decision = serde_json::from_value(value.clone())?;
        let e = self.knobs.endowment;
        let mut clamps = Vec::new();
        if d.local > e {
            clamps.push(format!("local {} -> {e} (the endowment)", d.local));
            d.local = e;
        }
        if d.local + d.global > e {
            let fitted = e - d.local;
            clamps.push(format!(
                "global {} -> {fitted} (local + global at most the endowment {e})",
                d.global
            ));
            d.global = fitted;
        }
        Ok(Parsed {
            decision: d,
            clamps,
        })
    }

    /// A citizen who could not decide gives nothing this round.
    fn no_change(&self, _world: &Commons, _agent: usize) -> Decision {
        Decision {
            local: 0,
            global: 0,
        }
    }

    fn scripted(
        &self,
        world: &Commons,
        population: &Population,
        agent: usize,
        rng: &mut ChaCha8Rng,
    ) -> Decision {
        let e = self.knobs.endowment as f64;
        let (local, global) = self.levels(population);
        let others = |level: usize, given: &[u32]| {
            Self::others_mean(population, level, agent, given, &world.levels[level])
        };
        let first = world.round == 0;
        // A first round, or a group of one, has no others to follow: each pot then gets a
        // share of the endowment that grows with the pot's marginal per-capita return (its
        // factor over the group's size), as contributions do in experiments (Isaac, Walker
        // and Thomas 1984): together 40% of the endowment at a return of 0, 80% at a return
        // of 1 (first rounds average 40-60% in the literature Ledyard 1995 surveys).
        let opening = |level: usize, factor: f64| {
            let g = population.groups.levels[level].of_agent[agent] as usize;
            let mpcr = factor / population.groups.levels[level].sizes[g] as f64;
            e * (0.4 + 0.4 * mpcr.min(1.0)) / 2.0
        };
        let openings = [
            opening(local, self.knobs.local_factor),
            opening(global, self.knobs.global_factor),
        ];
        let mut answer = |pot: usize, others: Option<f64>| -> f64 {
            let o = match (first, others) {
                (true, _) | (false, None) => openings[pot],
                (false, Some(o)) => o,
            };
            match world.kind[agent] {
                Kind::FreeRider => 0.0,
                // Imperfect conditional cooperation: a little less than the others gave.
                Kind::Conditional => 0.9 * o + rng.random_range(-1.0..=1.0),
                // Matches up to a quarter of the endowment, then gives less.
                Kind::HumpShaped => {
                    let peak = e / 4.0;
                    (if o <= peak {
                        o
                    } else {
                        (2.0 * peak - o).max(0.0)
                    }) + rng.random_range(-1.0..=1.0)
                }
            }
        };
        let l = answer(0, others(local, &world.local)).round().clamp(0.0, e) as u32;
        let g = answer(1, others(global, &world.global))
            .round()
            .clamp(0.0, e - l as f64) as u32;
        Decision {
            local: l,
            global: g,
        }
    }

    /// The citizens' splits: what each keeps is its own; the pots are shared as the levels
    /// react.
    fn resolve(
        &self,
        world: &mut Commons,
        _population: &Population,
        decisions: &[Option<Decision>],
        _rng: &mut ChaCha8Rng,
    ) {
        let e = self.knobs.endowment;
        for (a, d) in decisions.iter().enumerate() {
            let d = d.unwrap_or(Decision {
                local: 0,
                global: 0,
            });
            world.local[a] = d.local;
            world.global[a] = d.global;
            world.payoff[a] = (e - d.local - d.global) as f64;
        }
        world.round += 1;
        for pots in &mut world.levels {
            pots.total.clear();
            pots.share.clear();
        }
    }

    /// A local or global group pools its members' contributions, multiplies the pot and
    /// shares it equally; every level keeps its pots for the next round's prompts.
    fn react(&self, world: &mut Commons, population: &Population, group: GroupRef<'_>) {
        let (local, global) = self.levels(population);
        let level = &population.groups.levels[group.level];
        let (given, factor) = match group.level {
            l if l == local => (&world.local, self.knobs.local_factor),
            l if l == global => (&world.global, self.knobs.global_factor),
            _ => return,
        };
        let total: f64 = group
            .members
            .iter()
            .map(|&a| given[a as usize] as f64)
            .sum();
        let share = total * factor / level.sizes[group.index] as f64;
        for &a in group.members {
            world.payoff[a as usize] += share;
        }
        let pots = &mut world.levels[group.level];
        if pots.total.len() < level.len() {
            pots.total.resize(level.len(), 0.0);
            pots.share.resize(level.len(), 0.0);
        }
        pots.total[group.index] = total;
        pots.share[group.index] = share;
        // The outermost pot level settles last: the round's earnings are then complete.
        if group.level == global && group.index + 1 == level.len() {
            for (earned, payoff) in world.earnings.iter_mut().zip(&world.payoff) {
                *earned += payoff;
            }
        }
    }

    fn row(&self, world: &Commons, agent: usize, step: usize) -> Option<Row> {
        (step > 0).then(|| Row {
            kind: world.kind[agent].name().to_string(),
            local: world.local[agent] as f64,
            global: world.global[agent] as f64,
            private: (self.knobs.endowment - world.local[agent] - world.global[agent]) as f64,
            payoff: world.payoff[agent],
            earnings: world.earnings[agent],
        })
    }

    fn records(&self) -> &dyn Records<Self> {
        self
    }
}

/// Its state rows, and each cell's knobs in `cells.jsonl`, which the report reads.
impl Records<PublicGoods> for PublicGoods {
    fn describe(&self, _world: &Commons) -> Value {
        json!({ "knobs": self.knobs })
    }
}
