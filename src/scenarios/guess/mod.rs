//! "Guess 2/3 of the average", as in the million-agent study: every round each agent
//! submits a number in [0, 100]; the target is `ratio * mean + offset`; the agent closest to
//! it wins. Agents remember earlier rounds (their mean, target and winning number, and their
//! own guesses), may reason before answering (`prompt = "cot"`), and may be told that the game
//! is a variant of the classic.

pub mod config;
pub mod report;
pub mod rules;
mod scripted;
pub mod world;

use crate::sim::config::ScenarioProblem;
use crate::sim::plan::MemoryPart;
use crate::sim::population::{Population, PopulationSpec};
use crate::sim::scenario::{CellInfo, Parsed, Scenario, Turn};
use arrow_array::{
    ArrayRef, BooleanArray, Float32Array, Float64Array, RecordBatch, StringArray, UInt64Array,
    builder::StringDictionaryBuilder, types::UInt16Type,
};
use arrow_schema::{DataType, Field, Schema};
use config::{GuessConfig, PromptStyle};
use minijinja::context;
use rand_chacha::ChaCha8Rng;
use rules::{SCALE, to_hundredths};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use world::{Game, Guess};

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

impl GuessGame {
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

impl Scenario for GuessGame {
    type World = Game;
    type Decision = Decision;

    const NAME: &'static str = NAME;

    fn roles() -> &'static [&'static str] {
        &["player"]
    }

    fn from_table(table: &toml::Table) -> Result<Self, ScenarioProblem> {
        GuessConfig::from_table(table).map(Self::new)
    }

    fn check_population(&self, _population: &PopulationSpec) -> Result<(), ScenarioProblem> {
        // Any attributes describe the players; none are required.
        Ok(())
    }

    fn shared_context(&self, game: &Game, step: usize) -> minijinja::Value {
        let c = &self.cfg;
        let history: Vec<Value> = self
            .remembered(game.rounds())
            .filter_map(|r| {
                game.results[r].as_ref().map(|res| {
                    json!({
                        "round": r + 1,
                        "mean": num(res.mean),
                        "target": num(res.target),
                        "winning_number": num(res.winning_number),
                        "winning_numbers": res.winning_numbers().map(num).collect::<Vec<_>>(),
                        "winners": res.winners,
                    })
                })
            })
            .collect();
        minijinja::Value::from(minijinja::value::Serde(json!({
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
        })))
    }

    fn init(&self, population: &Population, _rng: &mut ChaCha8Rng) -> Game {
        Game::new(population.size)
    }

    fn num_agents(&self, game: &Game) -> usize {
        game.agents
    }

    fn acts(&self, _game: &Game, _agent: usize) -> bool {
        true
    }

    fn role(&self, _game: &Game, _agent: usize) -> &'static str {
        "player"
    }

    fn turn(&self, game: &Game, population: &Population, agent: usize, step: usize) -> Turn {
        let own: Vec<Value> = self
            .remembered(game.rounds())
            .map(|r| {
                let guess = game.guesses[r][agent];
                let result = game.results[r].as_ref();
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
        Turn {
            context: context! {
                round => step + 1,
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
    ) -> Result<Parsed<Decision>, String> {
        let reply: Reply = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
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

    fn resolve(&self, game: &mut Game, decisions: &[Option<Decision>], _rng: &mut ChaCha8Rng) {
        let round: Vec<Guess> = decisions.iter().map(|d| d.and_then(|d| d.0)).collect();
        game.results.push(self.cfg.rule().score(&round));
        game.guesses.push(round);
    }

    fn state(
        &self,
        game: &Game,
        population: &Population,
        cell: &CellInfo,
        step: usize,
    ) -> RecordBatch {
        let n = if step == 0 { 0 } else { game.agents };
        let round = step
            .checked_sub(1)
            .map(|r| (&game.guesses[r], &game.results[r]));
        let mut fields = vec![
            Field::new(
                "arm",
                DataType::Dictionary(Box::new(DataType::UInt16), Box::new(DataType::Utf8)),
                false,
            ),
            Field::new("population", DataType::UInt64, false),
            Field::new("replicate", DataType::UInt64, false),
            Field::new("step", DataType::UInt64, false),
            Field::new("agent", DataType::UInt64, false),
        ];
        let constant = |v: u64| Arc::new(UInt64Array::from_value(v, n)) as ArrayRef;
        let mut arm = StringDictionaryBuilder::<UInt16Type>::new();
        arm.append_values(&cell.arm, n);
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(arm.finish()),
            constant(cell.population as u64),
            constant(cell.replicate as u64),
            constant(step as u64),
            Arc::new(UInt64Array::from_iter_values(0..n as u64)),
        ];
        for (name, column) in &population.columns {
            match column {
                crate::sim::population::Column::Categorical { categories, codes } => {
                    fields.push(Field::new(
                        name,
                        DataType::Dictionary(Box::new(DataType::UInt16), Box::new(DataType::Utf8)),
                        false,
                    ));
                    let keys =
                        arrow_array::UInt16Array::from_iter_values(codes[..n].iter().copied());
                    let values = Arc::new(StringArray::from_iter_values(categories.iter()));
                    columns.push(Arc::new(
                        arrow_array::DictionaryArray::<UInt16Type>::try_new(keys, values)
                            .expect("invariant: codes index the categories"),
                    ));
                }
                crate::sim::population::Column::Numeric { values } => {
                    fields.push(Field::new(name, DataType::Float32, false));
                    columns.push(Arc::new(Float32Array::from_iter_values(
                        values[..n].iter().copied(),
                    )));
                }
            }
        }
        fields.push(Field::new("guess", DataType::Float64, true));
        fields.push(Field::new("won", DataType::Boolean, true));
        let (guesses, won): (Float64Array, BooleanArray) = match round {
            Some((guesses, result)) => {
                let won = |g: u16| result.as_ref().is_some_and(|r| r.won(hundredths(g)));
                (
                    guesses.iter().map(|g| g.map(hundredths)).collect(),
                    guesses.iter().map(|g| g.map(won)).collect(),
                )
            }
            None => (
                Float64Array::from(Vec::<f64>::new()),
                BooleanArray::from(Vec::<bool>::new()),
            ),
        };
        columns.push(Arc::new(guesses));
        columns.push(Arc::new(won));
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .expect("invariant: columns match their fields")
    }

    fn aggregates_schema() -> Option<arrow_schema::SchemaRef> {
        Some(report::round_batch(&[]).schema())
    }

    fn aggregates(&self, game: &Game, cell: &CellInfo, step: usize) -> Option<RecordBatch> {
        let result = step.checked_sub(1).and_then(|r| game.results.get(r))?;
        let mut row = report::RoundRow {
            arm: cell.arm.clone(),
            population: cell.population,
            replicate: cell.replicate,
            step,
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
        Some(report::round_batch(&[row]))
    }

    fn describe(&self, game: &Game) -> Value {
        json!({
            "players": game.agents,
            "rule": self.cfg.rule_text(),
            "equilibrium": self.cfg.rule().equilibrium().stable(),
            "equilibrium_text": self.cfg.rule().explain_equilibrium(),
            "prompt": self.cfg.prompt,
            "hint": self.cfg.hint,
        })
    }

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
