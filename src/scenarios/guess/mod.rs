//! "Guess 2/3 of the average", as in the million-agent study: every round each agent
//! submits a number in [0, 100]; the target is `ratio * mean + offset`; the agent closest to
//! it wins. Agents remember earlier rounds (their mean, target and winning number, and their
//! own guesses), may reason before answering (`prompt = "cot"`), and may be told that the game
//! is a variant of the classic.

pub mod config;
mod records;
pub mod report;
pub mod rules;
mod scripted;
pub mod world;

use crate::host::MemoryPart;
use crate::sim::config::ScenarioProblem;
use crate::sim::population::{Population, PopulationSpec};
use crate::sim::scenario::{
    CellInfo, Descriptor, ParseError, Parsed, Records, Scenario, Sizing, Turn,
};
use arrow_array::RecordBatch;
use config::{GuessConfig, PromptStyle};
use minijinja::context;
use rand_chacha::ChaCha8Rng;
use records::{Round, round_batch};
use rules::{SCALE, to_hundredths};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use world::{Game, Guess};

pub use records::{GROUP_ROUNDS, GroupRound};

pub const NAME: &str = "guess";

/// One arm of the game.
#[derive(Debug, Clone)]
pub struct GuessGame {
    pub cfg: GuessConfig,
    schema: Arc<Value>,
}

/// An agent's move: its guess in hundredths, `None` when it could not decide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision(pub Guess);

impl Serialize for Decision {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Out {
            guess: Option<f64>,
        }
        Out {
            guess: self.0.map(|g| g as f64 / SCALE as f64),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Decision {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct In {
            guess: Option<f64>,
        }
        // Hundredths written as f64 come back exactly: |g| <= 10^4 and g/100 rounds to the
        // nearest double, which times 100 rounds back to g.
        let In { guess } = In::deserialize(d)?;
        Ok(Decision(guess.map(|g| (g * SCALE as f64).round() as _)))
    }
}

/// What a reply must be: `{"guess": x}`, or `{"reasoning": "...", "guess": x}` with the
/// reasoning first, so that the model thinks before it commits to a number.
pub fn schema(cfg: &GuessConfig) -> Value {
    let guess = if cfg.decimals == 0 {
        json!({"type": "integer", "minimum": 0, "maximum": 100})
    } else {
        json!({"type": "number", "minimum": 0, "maximum": 100,
               "multipleOf": 10f64.powi(-(cfg.decimals as i32))})
    };
    match cfg.prompt {
        PromptStyle::Basic => json!({
            "type": "object",
            "properties": {"guess": guess},
            "required": ["guess"],
            "additionalProperties": false,
        }),
        PromptStyle::Cot => json!({
            "type": "object",
            "properties": {
                "reasoning": {"type": "string", "maxLength": cfg.reasoning_chars},
                "guess": guess,
            },
            "required": ["reasoning", "guess"],
            "additionalProperties": false,
        }),
    }
}

/// A reply's `guess`, from the model's JSON.
#[derive(Deserialize)]
struct Reply {
    guess: f64,
}

/// A round's result as prompts show it.
fn history(r: usize, res: &rules::RoundResult) -> Value {
    json!({
        "round": r + 1,
        "mean": num(res.mean),
        "target": num(res.target),
        "winning_number": num(res.winning_number),
        "winning_numbers": res.winning_numbers().map(num).collect::<Vec<_>>(),
        "winners": res.winners,
    })
}

impl GuessGame {
    /// The index of the level whose groups play games of their own, if any.
    fn group_level(&self, population: &Population) -> Option<usize> {
        let name = self.cfg.group.as_ref()?;
        population
            .groups
            .levels
            .iter()
            .position(|l| &l.name == name)
    }

    pub fn new(cfg: GuessConfig) -> Self {
        Self {
            schema: Arc::new(schema(&cfg)),
            cfg,
        }
    }

    /// The rounds an agent remembers before round `round` (1-based): the last `memory`.
    fn remembered(&self, rounds_played: usize) -> std::ops::Range<usize> {
        let keep = self.cfg.memory.unwrap_or(usize::MAX).min(rounds_played);
        rounds_played - keep..rounds_played
    }
}

fn hundredths(g: u16) -> f64 {
    g as f64 / SCALE as f64
}

/// Numbers in prompts as people write them: `33.33`, `50` (not `50.0`).
fn num(x: f64) -> Value {
    let r = (x * 100.0).round() / 100.0;
    if r.fract() == 0.0 && r.abs() < 1e15 {
        json!(r as i64)
    } else {
        json!(r)
    }
}

/// A player after a round: a row of the state table, after the runner's keys and the
/// population's attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `None`: the player sat the round out (its reply carried no guess).
    pub guess: Option<f64>,
    pub won: Option<bool>,
}

impl Scenario for GuessGame {
    type World = Game;
    type Decision = Decision;
    type Row = Row;

    const NAME: &'static str = NAME;

    fn roles() -> &'static [&'static str] {
        &["player"]
    }

    /// Its per-cell rounds (aggregates), and a grouped game's rounds per group (a table).
    fn descriptor() -> Descriptor {
        Descriptor::new(Self::NAME, Self::roles())
            .with_tables(&[GROUP_ROUNDS])
            .with_aggregates(round_batch(&[]).schema())
    }

    fn records(&self) -> &dyn Records<Self> {
        self
    }

    fn sizing(&self) -> Option<&dyn Sizing> {
        Some(self)
    }

    fn from_table(table: &toml::Table) -> Result<Self, ScenarioProblem> {
        GuessConfig::from_table(table).map(Self::new)
    }

    fn shared_context(&self, game: &Game, step: usize) -> minijinja::Value {
        let c = &self.cfg;
        // A grouped game's results are each group's: they go into the players' own prompts.
        let history: Vec<Value> = match game.grouped() {
            true => Vec::new(),
            false => self
                .remembered(game.rounds())
                .filter_map(|r| game.results[r].as_ref().map(|res| history(r, res)))
                .collect(),
        };
        let context = json!({
            "players": game.agents,
            "round": step + 1,
            "rule": c.rule_text(),
            "ratio": c.ratio.to_string(),
            "offset": c.offset.to_string(),
            "hint": c.hint,
            "prompt": c.prompt,
            "reasoning_chars": c.reasoning_chars,
            "decimals": c.decimals,
            "history": history,
            "group_level": c.group,
        });
        minijinja::Value::from(minijinja::value::Serde(context))
    }

    fn init(&self, population: &Population, _rng: &mut ChaCha8Rng) -> Game {
        let mut game = Game::new(population.size);
        if let Some(level) = self.group_level(population) {
            game.group_of = population.groups.levels[level].of_agent.clone();
        }
        game
    }

    fn check_population(
        &self,
        population: &PopulationSpec,
        _sizes: &[usize],
    ) -> Result<(), ScenarioProblem> {
        // Any attributes describe the players; a `group` must name a level.
        let Some(group) = &self.cfg.group else {
            return Ok(());
        };
        if population.groups.iter().any(|l| &l.name == group) {
            return Ok(());
        }
        let levels: Vec<&str> = population.groups.iter().map(|l| l.name.as_str()).collect();
        Err(ScenarioProblem::new(
            "group",
            format!(
                "`{group}` is not a group level: describe it under [[population.groups]] \
                 (levels here: {})",
                if levels.is_empty() {
                    "none".to_string()
                } else {
                    levels.join(", ")
                }
            ),
        ))
    }

    fn num_agents(&self, game: &Game) -> usize {
        game.agents
    }

    fn turn(&self, game: &Game, population: &Population, agent: usize, step: usize) -> Turn {
        let own: Vec<Value> = self
            .remembered(game.rounds())
            .map(|r| {
                let guess = game.guesses[r][agent];
                let result = game.result_for(r, agent);
                json!({
                    "round": r + 1,
                    "guess": guess.map(|g| num(hundredths(g))),
                    "won": match (guess, result) {
                        (Some(g), Some(res)) => res.won(hundredths(g)),
                        _ => false,
                    },
                })
            })
            .collect();
        let persona = self
            .cfg
            .show_profile
            .then(|| population.personas.as_ref().map(|p| p[agent].to_string()))
            .flatten();
        let profile: Vec<Value> = if self.cfg.show_profile && persona.is_none() {
            population
                .profile(agent)
                .map(|(name, value)| json!({"name": name, "value": value.to_string()}))
                .collect()
        } else {
            Vec::new()
        };
        let group = game.grouped().then(|| {
            let level = self
                .group_level(population)
                .expect("invariant: a grouped game's level exists");
            let g = game.group_of[agent] as usize;
            let history: Vec<Value> = self
                .remembered(game.rounds())
                .filter_map(|r| game.group_results[r][g].as_ref().map(|res| history(r, res)))
                .collect();
            json!({
                "level": population.groups.levels[level].name,
                "label": population.groups.levels[level].labels[g],
                "players": population.groups.levels[level].sizes[g],
                "history": history,
            })
        });
        Turn {
            context: context! {
                round => step + 1,
                group => minijinja::Value::from(minijinja::value::Serde(&group)),
                persona => persona,
                profile => minijinja::Value::from(minijinja::value::Serde(&profile)),
                own => minijinja::Value::from(minijinja::value::Serde(&own)),
            },
            schema: self.schema.clone(),
        }
    }

    fn parse(
        &self,
        _game: &Game,
        _agent: usize,
        value: &Value,
    ) -> Result<Parsed<Decision>, ParseError> {
        let reply: Reply = serde_json::from_value(value.clone())?;
        let mut clamps = Vec::new();
        if !(0.0..=100.0).contains(&reply.guess) {
            clamps.push(format!("guess {} -> within 0..=100", reply.guess));
        }
        Ok(Parsed {
            decision: Decision(Some(to_hundredths(reply.guess, self.cfg.decimals))),
            clamps,
        })
    }

    fn no_change(&self, _game: &Game, _agent: usize) -> Decision {
        // An agent that could not answer sits the round out rather than being given a number.
        Decision(None)
    }

    fn scripted(
        &self,
        game: &Game,
        population: &Population,
        agent: usize,
        rng: &mut ChaCha8Rng,
    ) -> Decision {
        Decision(Some(scripted::guess(
            &self.cfg, game, population, agent, rng,
        )))
    }

    fn resolve(
        &self,
        game: &mut Game,
        population: &Population,
        decisions: &[Option<Decision>],
        _rng: &mut ChaCha8Rng,
    ) {
        let round: Vec<Guess> = decisions.iter().map(|d| d.and_then(|d| d.0)).collect();
        let rule = self.cfg.rule();
        game.results.push(rule.score(&round));
        if let Some(level) = game
            .grouped()
            .then(|| self.group_level(population))
            .flatten()
        {
            let groups = &population.groups;
            let results = (0..groups.levels[level].len())
                .map(|g| {
                    let guesses: Vec<Guess> = groups
                        .members(level, g)
                        .iter()
                        .map(|&a| round[a as usize])
                        .collect();
                    rule.score(&guesses)
                })
                .collect();
            game.group_results.push(results);
        }
        game.guesses.push(round);
    }

    /// A player's guess and whether it won, from the first round on (none before it).
    fn row(&self, game: &Game, agent: usize, step: usize) -> Option<Row> {
        let round = step.checked_sub(1)?;
        let guess = game.guesses[round][agent];
        let result = game.result_for(round, agent);
        Some(Row {
            guess: guess.map(hundredths),
            won: guess.map(|g| result.is_some_and(|r| r.won(hundredths(g)))),
        })
    }
}

/// The game's records: its rounds, per cell and per group, and its rules per cell.
impl Records<GuessGame> for GuessGame {
    /// A grouped game's rounds, one row per group (none for a game of the whole cell).
    fn table(&self, name: &str, game: &Game, cell: &CellInfo, step: usize) -> Option<RecordBatch> {
        let level = self.cfg.group.as_ref()?;
        let results = step
            .checked_sub(1)
            .and_then(|r| game.group_results.get(r))
            .filter(|_| name == GROUP_ROUNDS)?;
        let mut players = vec![0usize; results.len()];
        for &g in &game.group_of {
            players[g as usize] += 1;
        }
        let rows: Vec<GroupRound> = results
            .iter()
            .enumerate()
            .map(|(g, r)| GroupRound {
                arm: cell.arm.clone(),
                population: cell.population,
                replicate: cell.replicate,
                step,
                level: level.clone(),
                group: g,
                players: players[g],
                guesses: r.as_ref().map_or(0, |r| r.guesses as usize),
                mean: r.as_ref().map(|r| r.mean),
                target: r.as_ref().map(|r| r.target),
                winning_number: r.as_ref().map(|r| r.winning_number),
                winners: r.as_ref().map_or(0, |r| r.winners as usize),
            })
            .collect();
        use serde_arrow::schema::{SchemaLike, TracingOptions};
        let fields = Vec::<arrow_schema::FieldRef>::from_type::<GroupRound>(
            TracingOptions::default().allow_null_fields(true),
        )
        .expect("invariant: the group round type traces");
        Some(
            serde_arrow::to_record_batch(&fields, &rows)
                .expect("invariant: rows fit the traced schema"),
        )
    }

    fn aggregates(&self, game: &Game, _cell: &CellInfo, step: usize) -> Option<RecordBatch> {
        let result = step.checked_sub(1).and_then(|r| game.results.get(r))?;
        let mut row = Round {
            players: game.agents,
            guesses: 0,
            mean: None,
            median: None,
            std: None,
            min: None,
            max: None,
            target: None,
            winning_number: None,
            tied_winning_number: None,
            winners: 0,
            equilibrium: self.cfg.rule().equilibrium().stable(),
        };
        if let Some(r) = result {
            row.guesses = r.guesses as usize;
            row.mean = Some(r.mean);
            row.median = Some(r.median);
            row.std = Some(r.std);
            row.min = Some(r.min);
            row.max = Some(r.max);
            row.target = Some(r.target);
            row.winning_number = Some(r.winning_number);
            row.tied_winning_number = r.tied_winning_number;
            row.winners = r.winners as usize;
        }
        Some(round_batch(&[row]))
    }

    fn describe(&self, game: &Game) -> Value {
        let mut described = json!({
            "players": game.agents,
            "rule": self.cfg.rule_text(),
            "equilibrium": self.cfg.rule().equilibrium().stable(),
            "equilibrium_text": self.cfg.rule().explain_equilibrium(),
            "prompt": self.cfg.prompt,
            "hint": self.cfg.hint,
        });
        if let Some(level) = &self.cfg.group {
            described["group"] = json!(level);
        }
        described
    }
}

impl Sizing for GuessGame {
    fn memory(&self, agents: f64, steps: f64) -> Vec<MemoryPart> {
        vec![
            // A guess per agent and round, kept for the prompts' memory, and its copy in the
            // checkpoint as it is written.
            MemoryPart::new(
                "every round's guesses",
                "steps, agents or replicates",
                agents * steps * (std::mem::size_of::<Guess>() as f64 + 4.0),
            ),
            MemoryPart::new(
                "a step's state rows",
                "agents or replicates",
                agents * STATE_ROW_BYTES,
            ),
        ]
    }
}

/// A step's state row of one agent, as built and as the Parquet writer buffers it (measured
/// at about 100 bytes on a million agents).
const STATE_ROW_BYTES: f64 = 128.0;
