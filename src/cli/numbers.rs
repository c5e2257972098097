//! The command line's numbers, refused at parse time when no run could use them: clap then
//! names the flag and the value (`--block-size 0` divided by zero in `throng bench`).

use crate::engine::SamplingParams;
use clap::builder::ValueParser;

/// A count of at least 1 (tokens per block, agents, steps, sequences).
pub(crate) fn at_least_one() -> ValueParser {
    ValueParser::new(|text: &str| -> Result<usize, String> {
        match text.trim().parse::<usize>() {
            Ok(0) => Err("0 cannot work here: give at least 1".into()),
            Ok(n) => Ok(n),
            Err(_) => Err(format!("`{text}` is not a whole number of at least 1")),
        }
    })
}

/// A number read as f32 and checked by `check`, whose message clap shows with the flag.
fn checked_f32(check: fn(f32) -> Result<(), String>) -> ValueParser {
    let parse = move |text: &str| -> Result<f32, String> {
        let value: f32 = text
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a number"))?;
        check(value).map(|()| value)
    };
    ValueParser::new(parse)
}

/// The problem of sampling settings, if `params` has one.
fn sampling(params: SamplingParams) -> Result<(), String> {
    params.problem().map_or(Ok(()), Err)
}

/// A sampling temperature: finite and at least 0 (0 is greedy).
pub fn temperature() -> ValueParser {
    checked_f32(|t| {
        sampling(SamplingParams {
            temperature: t,
            ..SamplingParams::default()
        })
    })
}

/// A nucleus share `top_p`: in (0, 1].
pub fn top_p() -> ValueParser {
    checked_f32(|p| {
        sampling(SamplingParams {
            top_p: p,
            ..SamplingParams::default()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Flags {
        #[arg(long, value_parser = at_least_one())]
        block_size: Option<usize>,
        #[arg(long, value_parser = temperature(), default_value = "0.7", allow_negative_numbers = true)]
        temperature: f32,
        #[arg(long, value_parser = top_p(), default_value = "1", allow_negative_numbers = true)]
        top_p: f32,
    }

    fn refused(args: &[&str]) -> String {
        let argv = std::iter::once("x").chain(args.iter().copied());
        Flags::try_parse_from(argv).unwrap_err().to_string()
    }

    #[test]
    fn numbers_that_cannot_work_are_refused_naming_the_flag() {
        let ok = Flags::try_parse_from(["x", "--block-size", "16", "--top-p", "0.9"]).unwrap();
        assert_eq!(
            (ok.block_size, ok.temperature, ok.top_p),
            (Some(16), 0.7, 0.9)
        );
        for (args, words) in [
            (
                &["--block-size", "0"][..],
                "0 cannot work here: give at least 1",
            ),
            (&["--block-size", "x"], "`x` is not a whole number"),
            (
                &["--temperature", "-1"],
                "temperature must be a finite number >= 0",
            ),
            (
                &["--temperature", "nan"],
                "temperature must be a finite number >= 0",
            ),
            (&["--top-p", "0"], "top_p must be in (0, 1]"),
            (&["--top-p", "1.5"], "top_p must be in (0, 1]"),
            (&["--top-p", "x"], "`x` is not a number"),
        ] {
            let err = refused(args);
            assert!(
                err.contains(args[0]) && err.contains(words),
                "{args:?}: {err}"
            );
        }
    }
}
