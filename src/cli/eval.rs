//! `throng eval`: the quality gate of weight formats on a model (see `crate::quality`).

use crate::model::WeightFormat;
use crate::quality::{self, EvalSpec};
use crate::run::parse_device;
use anyhow::{Context, Result, bail};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// A preset (`throng models`), a model folder, a GGUF file or a Hugging Face repo id.
    #[arg(long, default_value = crate::model::DEFAULT_MODEL)]
    pub model: String,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The formats compared with f32, comma-separated (default: every format `auto` can
    /// choose on the device).
    #[arg(long, value_parser = super::choice::WeightsArg::parser(), value_delimiter = ',')]
    pub weights: Vec<WeightFormat>,
    /// How the candidates' KV caches store keys and values (the f32 reference's is f32).
    #[arg(long, value_parser = super::choice::KvFormatArg::parser(), default_value = "auto")]
    pub kv_format: crate::model::KvFormat,
    /// A tokenizer.json to use instead of the model's own.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Requests of the agent workload decided at temperature 0.
    #[arg(long, default_value_t = 256)]
    pub decisions: usize,
    /// Agent prompts whose next-token distributions are compared.
    #[arg(long, default_value_t = 24)]
    pub prompts: usize,
    /// Seeds the agent workload.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A text file whose perplexity is measured instead of the shipped text.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write every reply of the decision workload here, one JSON line each (format, tag,
    /// finish, valid, text): what each format answered where they differ.
    #[arg(long)]
    pub replies: Option<PathBuf>,
}

pub fn run(args: EvalArgs) -> Result<()> {
    let device = parse_device(&args.device)?;
    let mut spec = EvalSpec::new(args.model.clone(), device);
    if !args.weights.is_empty() {
        if let Some(bad) = args
            .weights
            .iter()
            .find(|w| matches!(w, WeightFormat::Auto | WeightFormat::F32))
        {
            bail!(
                "--weights {}: the gate compares formats with f32; name concrete formats such as \
                 int8,q8_0,bf16",
                quality::name(*bad)
            );
        }
        spec.formats = args.weights.clone();
    }
    spec.tokenizer = args.tokenizer;
    spec.kv_format = args.kv_format;
    spec.decisions = args.decisions;
    spec.prompts = args.prompts;
    spec.seed = args.seed;
    if let Some(path) = &args.text {
        spec.text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the text {}", path.display()))?;
    }
    let report = quality::evaluate(&spec, |what| eprintln!("throng eval: {what}"))
        .with_context(|| format!("evaluating `{}`", args.model))?;
    out!("{}", report.text())?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.replies {
        let mut lines = String::new();
        for reply in &report.replies {
            lines.push_str(&serde_json::to_string(reply)?);
            lines.push('\n');
        }
        std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))?;
    }
    if !report.passes() {
        bail!("a weight format fails the quality gate (see above)");
    }
    Ok(())
}
