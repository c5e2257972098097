//! The game's arithmetic, exactly: guesses are whole hundredths, the target rule's ratio and
//! offset are fractions, so the target and every distance to it are exact rationals and the
//! winner and its ties never depend on rounding.

use serde::{Deserialize, Serialize};

/// Guesses are stored in hundredths: 0 ..= 10000 is 0 ..= 100.
pub(crate) const SCALE: i64 = 100;
pub(crate) const MAX_GUESS: u16 = 100 * SCALE as u16;

/// An exact fraction `num / den` (den > 0), read from `"2/3"`, `0.51` or `5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub struct Fraction {
    pub num: i64,
    pub den: i64,
}

/// Why a number cannot be an exact [`Fraction`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FractionError {
    #[error("{0}/0 divides by zero")]
    ZeroDenominator(i64),
    #[error("{0} is not a number")]
    NotFinite(f64),
    #[error("`{0}`: the numerator must be a whole number")]
    Numerator(String),
    #[error("`{0}`: the denominator must be a whole number")]
    Denominator(String),
    /// Neither a decimal nor `a/b`.
    #[error("`{0}` is not a number or a fraction like 2/3")]
    NotANumber(String),
    /// An exponent that is not a whole number (`1e-x`).
    #[error("`{0}` is not a number")]
    Exponent(String),
    /// More than 12 decimal places, or a power of ten past them: no exact i64 fraction.
    #[error("`{0}` has too many digits for an exact fraction")]
    TooManyDigits(String),
}

impl Fraction {
    pub fn new(num: i64, den: i64) -> Result<Self, FractionError> {
        if den == 0 {
            return Err(FractionError::ZeroDenominator(num));
        }
        let (num, den) = if den < 0 { (-num, -den) } else { (num, den) };
        let g = gcd(num.unsigned_abs(), den.unsigned_abs()).max(1) as i64;
        Ok(Self {
            num: num / g,
            den: den / g,
        })
    }

    pub fn value(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// From a decimal's shortest spelling (`0.51` -> 51/100), so that what the user wrote is
    /// what is computed.
    pub(crate) fn from_f64(x: f64) -> Result<Self, FractionError> {
        if !x.is_finite() {
            return Err(FractionError::NotFinite(x));
        }
        let mut buffer = ryu::Buffer::new();
        Self::parse(buffer.format(x))
    }

    /// `"2/3"`, `"-1/2"`, `"0.51"`, `"5"`, `"1e-2"`.
    pub fn parse(text: &str) -> Result<Self, FractionError> {
        let text = text.trim();
        if let Some((n, d)) = text.split_once('/') {
            let n: i64 = n
                .trim()
                .parse()
                .map_err(|_| FractionError::Numerator(text.into()))?;
            let d: i64 = d
                .trim()
                .parse()
                .map_err(|_| FractionError::Denominator(text.into()))?;
            return Self::new(n, d);
        }
        let (mantissa, exponent) = match text.split_once(['e', 'E']) {
            Some((m, e)) => (
                m,
                e.parse::<i32>()
                    .map_err(|_| FractionError::Exponent(text.into()))?,
            ),
            None => (text, 0),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let digits = format!("{int}{frac}");
        let num: i64 = digits
            .parse()
            .map_err(|_| FractionError::NotANumber(text.into()))?;
        let scale = exponent - frac.len() as i32;
        if scale.abs() > 12 {
            return Err(FractionError::TooManyDigits(text.into()));
        }
        if scale >= 0 {
            Self::new(num * 10i64.pow(scale as u32), 1)
        } else {
            Self::new(num, 10i64.pow((-scale) as u32))
        }
    }
}

impl From<Fraction> for String {
    fn from(f: Fraction) -> String {
        f.to_string()
    }
}

impl std::fmt::Display for Fraction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Float(f64),
            Text(String),
        }
        let parsed = match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a number or a fraction such as \"2/3\"")
        })? {
            Raw::Int(i) => Fraction::new(i, 1),
            Raw::Float(x) => Fraction::from_f64(x),
            Raw::Text(t) => Fraction::parse(&t),
        };
        parsed.map_err(serde::de::Error::custom)
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `target = ratio * mean + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetRule {
    pub ratio: Fraction,
    pub offset: Fraction,
}

/// The outcome of one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundResult {
    /// Agents who submitted a guess (the others could not decide).
    pub guesses: u64,
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    pub target: f64,
    /// The guess closest to the target (the lower one when guesses on both sides of the
    /// target are equally close).
    pub winning_number: f64,
    /// The other winning guess when guesses on both sides of the target are equally close
    /// (target 22.5, guesses 22 and 23): the higher one. Both win.
    #[serde(default)]
    pub tied_winning_number: Option<f64>,
    /// Agents whose guess is closest to the target: every agent who guessed a winning number.
    pub winners: u64,
}

impl RoundResult {
    /// Whether `guess` won the round: the one definition of a winner that the state's `won`
    /// column, the prompts' "(you won)", the aggregates' `winners` and the report share.
    pub fn won(&self, guess: f64) -> bool {
        guess == self.winning_number || Some(guess) == self.tied_winning_number
    }

    /// The winning numbers, lower first (one, or two on both sides of the target).
    pub(crate) fn winning_numbers(&self) -> impl Iterator<Item = f64> + '_ {
        std::iter::once(self.winning_number).chain(self.tied_winning_number)
    }
}

/// Where best responses lead when every guess is clamped to [0, 100]: the fixed points of
/// `x -> clamp(ratio x + offset, 0, 100)` (a crowd all guessing a fixed point has its target
/// there), and which of them play converges to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Equilibrium {
    /// Best responses converge to `at` from any start. `unstable`: another fixed point, which
    /// play leaves at the slightest deviation (ratio above 1 without offset: 0).
    Stable { at: f64, unstable: Option<f64> },
    /// Two equilibria, 0 and 100 (ratio above 1, negative offset): play whose mean starts
    /// below `threshold` falls to 0, above it climbs to 100.
    Split { threshold: f64 },
    /// Every number is one: ratio 1 without offset makes the target the mean itself.
    Every,
}

impl Equilibrium {
    /// The single number best responses converge to from any start, if there is one.
    pub(crate) fn stable(&self) -> Option<f64> {
        match self {
            Equilibrium::Stable { at, .. } => Some(*at),
            _ => None,
        }
    }
}

/// A number as the report writes it: `10`, `33.33`.
fn short(x: f64) -> String {
    let r = (x * 100.0).round() / 100.0;
    if r.fract() == 0.0 {
        format!("{}", r as i64)
    } else {
        format!("{r}")
    }
}

impl TargetRule {
    /// The equilibrium of the clamped rule, computed exactly. With `r = ratio`, `c = offset`
    /// and `x* = c / (1 - r)`, where the line `r x + c` crosses the diagonal:
    /// - `r < 1`: the rule pulls every mean towards `x*` (clamped to [0, 100]), the one
    ///   equilibrium (2/3: 0; 5 + mean/2: 10).
    /// - `r = 1`: the target is the mean plus `c`: with `c > 0` it is above every mean and
    ///   best responses climb to the bound 100, with `c < 0` they fall to 0, and with `c = 0`
    ///   every number is an equilibrium.
    /// - `r > 1`: `x*` repels. Below it the target is under the mean and play falls to 0;
    ///   above it, play climbs to 100. So `x* <= 0` (`c >= 0`) gives 100 (and 0 too when
    ///   `c = 0`, unstable), `x* >= 100` gives 0, and `x*` within (0, 100) gives both bounds,
    ///   split at `x*`.
    pub fn equilibrium(&self) -> Equilibrium {
        let (p, q) = (self.ratio.num as i128, self.ratio.den as i128);
        let (a, b) = (self.offset.num as i128, self.offset.den as i128);
        let top = 100;
        match (p - q).signum() {
            // x* = c / (1 - r) = a q / (b (q - p)), with b (q - p) > 0.
            -1 => {
                let (num, den) = (a * q, b * (q - p));
                let at = if num <= 0 {
                    0.0
                } else if num >= top * den {
                    100.0
                } else {
                    num as f64 / den as f64
                };
                Equilibrium::Stable { at, unstable: None }
            }
            0 => match a.signum() {
                0 => Equilibrium::Every,
                1 => Equilibrium::Stable {
                    at: 100.0,
                    unstable: None,
                },
                _ => Equilibrium::Stable {
                    at: 0.0,
                    unstable: None,
                },
            },
            // x* = c / (1 - r) = -a q / (b (p - q)), with b (p - q) > 0.
            _ => {
                let (num, den) = (-a * q, b * (p - q));
                match (num.signum(), (num - top * den).signum()) {
                    (-1, _) => Equilibrium::Stable {
                        at: 100.0,
                        unstable: None,
                    },
                    (0, _) => Equilibrium::Stable {
                        at: 100.0,
                        unstable: Some(0.0),
                    },
                    (_, -1) => Equilibrium::Split {
                        threshold: num as f64 / den as f64,
                    },
                    (_, 0) => Equilibrium::Stable {
                        at: 0.0,
                        unstable: Some(100.0),
                    },
                    _ => Equilibrium::Stable {
                        at: 0.0,
                        unstable: None,
                    },
                }
            }
        }
    }

    /// The equilibrium and why, in a sentence for the report.
    pub(crate) fn explain_equilibrium(&self) -> String {
        let (r, c) = (self.ratio, self.offset);
        let one = Fraction { num: 1, den: 1 };
        // `3/2 x + 5`, `3/2 x`, `2 x - 50`.
        let line = match c.num.signum() {
            0 => format!("{r} x"),
            1 => format!("{r} x + {c}"),
            _ => format!(
                "{r} x - {}",
                Fraction {
                    num: -c.num,
                    den: c.den
                }
            ),
        };
        let crossing = || {
            let x = c.value() / (1.0 - r.value());
            format!("x = {line} only at x = {}", short(x))
        };
        match self.equilibrium() {
            Equilibrium::Every => "none: with ratio 1 and no offset the target is the mean itself, so every number is an equilibrium (a crowd that all guess the same number all win)".into(),
            Equilibrium::Stable { at, .. } if r == one => format!(
                "{}: with ratio 1 the target is the mean {} {}, so best responses {} by {} a round until guesses, clamped to [0, 100], stop at {}",
                short(at),
                if c.num > 0 { "plus" } else { "minus" },
                short(c.value().abs()),
                if c.num > 0 { "climb" } else { "fall" },
                short(c.value().abs()),
                short(at),
            ),
            Equilibrium::Stable { at, unstable: None } if r.value() < 1.0 => {
                let x = c.value() / (1.0 - r.value());
                if (0.0..=100.0).contains(&x) {
                    format!("{}: x = {line} there, and with ratio {r} below 1 best responses close in on it from any start", short(at))
                } else {
                    format!("{}: {}, outside [0, 100], so best responses stop at the bound {}", short(at), crossing(), short(at))
                }
            }
            Equilibrium::Stable { at, unstable } => {
                let direction = if at > 0.0 { "above" } else { "below" };
                let moves = if at > 0.0 { "climb" } else { "fall" };
                let except = unstable.map_or(String::new(), |u| format!(" but {}", short(u)));
                let mut text = format!(
                    "{}: with ratio {r} above 1, {}, so the target lies {direction} the mean for every mean in [0, 100]{except} and best responses {moves} until guesses, clamped to [0, 100], stop at {}",
                    short(at),
                    crossing(),
                    short(at),
                );
                if let Some(u) = unstable {
                    text.push_str(&format!(
                        "; {} is an equilibrium too, but an unstable one: play that starts anywhere else {moves}s to {}",
                        short(u),
                        short(at)
                    ));
                }
                text
            }
            Equilibrium::Split { threshold } => format!(
                "0 or 100: with ratio {r} above 1, x = {line} at x = {}, which repels: play whose mean starts below it falls to 0, above it climbs to 100 (guesses are clamped to [0, 100]), and both bounds are equilibria",
                short(threshold)
            ),
        }
    }

    /// The exact target for guesses summing to `sum` hundredths over `n` agents, as
    /// `(numerator, denominator)` in hundredths.
    fn target_exact(&self, sum: i128, n: i128) -> (i128, i128) {
        let (p, q) = (self.ratio.num as i128, self.ratio.den as i128);
        let (a, b) = (self.offset.num as i128, self.offset.den as i128);
        // p/q * sum/n + a/b * SCALE  =  (p*sum*b + a*SCALE*q*n) / (q*n*b)
        (p * sum * b + a * SCALE as i128 * q * n, q * n * b)
    }

    /// Scores one round of guesses (hundredths; `None` for agents without a guess).
    /// Returns `None` when nobody guessed. Linear in the number of agents: guesses are
    /// counted per value (there are at most 10,001 of them) rather than sorted.
    pub fn score(&self, guesses: &[Option<u16>]) -> Option<RoundResult> {
        let mut counts = vec![0u64; MAX_GUESS as usize + 1];
        for g in guesses.iter().flatten() {
            counts[*g as usize] += 1;
        }
        let len: u64 = counts.iter().sum();
        if len == 0 {
            return None;
        }
        let values = || {
            counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(v, &c)| (v as i128, c))
        };
        let n = len as i128;
        let sum: i128 = values().map(|(v, c)| v * c as i128).sum();
        let (tn, td) = self.target_exact(sum, n);
        // |g - tn/td| * td, compared as integers.
        let distance = |g: i128| (g * td - tn).abs();
        let best = values().map(|(v, _)| distance(v)).min().expect("non-empty");
        // At most two numbers are equally close to the target: one on each side of it.
        let (winning, winners) = values().filter(|&(v, _)| distance(v) == best).fold(
            (Vec::with_capacity(2), 0),
            |(mut numbers, total), (v, c)| {
                numbers.push(v);
                (numbers, total + c)
            },
        );
        // The k-th smallest guess (0-based), walking the counts.
        let nth = |k: u64| {
            let mut seen = 0;
            for (v, c) in values() {
                seen += c;
                if seen > k {
                    return v as f64;
                }
            }
            unreachable!("k < len")
        };
        let median = if len % 2 == 1 {
            nth(len / 2)
        } else {
            (nth(len / 2 - 1) + nth(len / 2)) / 2.0
        };
        let mean = sum as f64 / n as f64;
        let var = if len > 1 {
            values()
                .map(|(v, c)| c as f64 * (v as f64 - mean).powi(2))
                .sum::<f64>()
                / (len - 1) as f64
        } else {
            0.0
        };
        let s = SCALE as f64;
        Some(RoundResult {
            guesses: len,
            mean: mean / s,
            median: median / s,
            std: var.sqrt() / s,
            min: values().next().expect("non-empty").0 as f64 / s,
            max: values().next_back().expect("non-empty").0 as f64 / s,
            target: tn as f64 / td as f64 / s,
            winning_number: winning[0] as f64 / s,
            tied_winning_number: winning.get(1).map(|&v| v as f64 / s),
            winners,
        })
    }
}

/// A guess in hundredths from a number of the range, rounded to `decimals` places.
pub(crate) fn to_hundredths(x: f64, decimals: u32) -> u16 {
    let step = 10f64.powi(2 - decimals.min(2) as i32);
    let h = (x.clamp(0.0, 100.0) * SCALE as f64 / step).round() * step;
    h.clamp(0.0, MAX_GUESS as f64) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(ratio: &str, offset: &str) -> TargetRule {
        TargetRule {
            ratio: Fraction::parse(ratio).unwrap(),
            offset: Fraction::parse(offset).unwrap(),
        }
    }

    fn h(xs: &[f64]) -> Vec<Option<u16>> {
        xs.iter().map(|&x| Some(to_hundredths(x, 2))).collect()
    }

    #[test]
    fn fractions_are_read_exactly() {
        assert_eq!(Fraction::parse("2/3").unwrap(), Fraction { num: 2, den: 3 });
        assert_eq!(Fraction::parse("4/6").unwrap(), Fraction { num: 2, den: 3 });
        assert_eq!(
            Fraction::from_f64(0.51).unwrap(),
            Fraction { num: 51, den: 100 }
        );
        assert_eq!(Fraction::parse("5").unwrap(), Fraction { num: 5, den: 1 });
        assert_eq!(
            Fraction::parse("1e-2").unwrap(),
            Fraction { num: 1, den: 100 }
        );
        assert_eq!(
            Fraction::parse("-1/2").unwrap(),
            Fraction { num: -1, den: 2 }
        );
        assert!(Fraction::parse("1/0").is_err());
        assert!(Fraction::parse("two thirds").is_err());
    }

    // Hand-computed: guesses 20, 40, 60 have mean 40.
    #[test]
    fn two_thirds_of_the_average() {
        let r = rule("2/3", "0").score(&h(&[20.0, 40.0, 60.0])).unwrap();
        // 2/3 * 40 = 26.666..., closest: 20 (6.67 away) vs 40 (13.3).
        assert!((r.target - 80.0 / 3.0).abs() < 1e-12);
        assert_eq!((r.winning_number, r.winners), (20.0, 1));
        assert_eq!((r.mean, r.median, r.min, r.max), (40.0, 40.0, 20.0, 60.0));
        assert!((r.std - 20.0).abs() < 1e-12);
    }

    #[test]
    fn every_variant_of_the_study() {
        let g = h(&[10.0, 30.0, 50.0, 90.0]); // mean 45
        for (ratio, offset, target) in [
            ("1/2", "0", 22.5),
            ("3/5", "0", 27.0),
            ("51/100", "0", 22.95),
            ("67/100", "0", 30.15),
            ("2/3", "0", 30.0),
            ("1/2", "5", 27.5),
        ] {
            let r = rule(ratio, offset).score(&g).unwrap();
            assert!((r.target - target).abs() < 1e-9, "{ratio} {offset}: {r:?}");
        }
        // 5 + mean/2 has its equilibrium at 10; 2/3 at 0.
        assert_eq!(rule("1/2", "5").equilibrium().stable(), Some(10.0));
        assert_eq!(rule("2/3", "0").equilibrium().stable(), Some(0.0));
    }

    #[test]
    fn ties_are_counted_exactly() {
        // Mean 45, target 2/3 * 45 = 30: two agents at 30 tie exactly.
        let r = rule("2/3", "0").score(&h(&[30.0, 30.0, 75.0])).unwrap();
        assert_eq!((r.winning_number, r.winners), (30.0, 2));
        assert_eq!(r.tied_winning_number, None);
        // Mean 30.5 over (29.5, 31.5): target 1 * mean = 30.5 is 1 from both; in floats
        // 30.5 - 29.5 and 31.5 - 30.5 are equal too, but 2/3-style targets are not, so the
        // rule compares exact rationals. 1/3 * (10 + 20.01)/2 = 5.00166..: 5 wins alone.
        let r = rule("1", "0").score(&h(&[29.5, 31.5])).unwrap();
        assert_eq!((r.winning_number, r.winners), (29.5, 2));
        assert_eq!(r.tied_winning_number, Some(31.5));
        let r = rule("1/3", "0")
            .score(&h(&[10.0, 20.01, 5.0, 5.0]))
            .unwrap();
        // mean (10 + 20.01 + 5 + 5)/4 = 10.0025, target 3.334166..: the two 5s win.
        assert_eq!((r.winning_number, r.winners), (5.0, 2));
    }

    // Guards against issue 17, item 5: with guesses on both sides of the target equally
    // close, `winners` counted all of them but only the lower number was a winner for the
    // state's `won` and the prompts' "(you won)".
    #[test]
    fn guesses_on_both_sides_of_the_target_all_win() {
        // Mean 33.75, target 22.5: 22 and 23 are both 0.5 away (the round).
        let r = rule("2/3", "0")
            .score(&h(&[22.0, 23.0, 22.0, 23.0, 45.0, 45.0, 45.0, 45.0]))
            .unwrap();
        assert_eq!(r.target, 22.5);
        assert_eq!(
            (r.winning_number, r.tied_winning_number, r.winners),
            (22.0, Some(23.0), 4)
        );
        assert!(r.won(22.0) && r.won(23.0) && !r.won(45.0) && !r.won(22.5));
        assert_eq!(r.winning_numbers().collect::<Vec<_>>(), vec![22.0, 23.0]);
        // In hundredths: 5 + 1/2 x mean with guesses 10.00, 10.01 and 0.01 has mean 6.6733..
        // and target 8.3366..: no tie; 10 and 10.02 around a target of exactly 10.01 tie.
        let r = rule("1/2", "5").score(&h(&[10.0, 10.01, 0.01])).unwrap();
        assert_eq!(r.tied_winning_number, None);
        let r = rule("1", "0").score(&h(&[10.0, 10.02])).unwrap();
        assert_eq!(
            (r.winning_number, r.tied_winning_number),
            (10.0, Some(10.02))
        );
        assert!(r.won(10.0) && r.won(10.02));
        // Equally close on one side only is a single winning number, however many chose it.
        let r = rule("2/3", "0").score(&h(&[20.0, 20.0, 50.0])).unwrap();
        assert_eq!(
            (r.winning_number, r.tied_winning_number, r.winners),
            (20.0, None, 2)
        );
    }

    // Guards against issue 17, item 6: `ratio = "3/2", offset = 5` reported an equilibrium of
    // 0, although its targets climb to the bound 100.
    #[test]
    fn equilibria_of_the_clamped_rule_for_every_ratio() {
        use Equilibrium::*;
        let stable = |at: f64| Stable { at, unstable: None };
        for (ratio, offset, expected) in [
            // Below 1: the crossing x = c / (1 - r), clamped to [0, 100].
            ("2/3", "0", stable(0.0)),
            ("1/2", "5", stable(10.0)),
            ("1/2", "-5", stable(0.0)),
            ("1/2", "80", stable(100.0)),
            ("0", "30", stable(30.0)),
            // 1: the mean itself (every number), or climbing/falling by the offset.
            ("1", "0", Every),
            ("1", "5", stable(100.0)),
            ("1", "-1/2", stable(0.0)),
            // Above 1: the crossing repels.
            ("3/2", "5", stable(100.0)),
            (
                "3/2",
                "0",
                Stable {
                    at: 100.0,
                    unstable: Some(0.0),
                },
            ),
            ("2", "-50", Split { threshold: 50.0 }),
            (
                "2",
                "-100",
                Stable {
                    at: 0.0,
                    unstable: Some(100.0),
                },
            ),
            ("3", "-250", stable(0.0)),
        ] {
            let r = rule(ratio, offset);
            assert_eq!(r.equilibrium(), expected, "{ratio} x mean + {offset}");
            assert!(!r.explain_equilibrium().is_empty());
        }
        assert_eq!(rule("3/2", "5").equilibrium().stable(), Some(100.0));
        assert_eq!(rule("1", "0").equilibrium().stable(), None);
        assert_eq!(rule("2", "-50").equilibrium().stable(), None);
        let text = rule("3/2", "5").explain_equilibrium();
        assert!(
            text.starts_with("100: ") && text.contains("x = -10") && text.contains("climb"),
            "{text}"
        );
        assert!(rule("1", "0").explain_equilibrium().starts_with("none: "));
        let split = rule("2", "-50").explain_equilibrium();
        assert!(
            split.starts_with("0 or 100: ") && split.contains("x = 50"),
            "{split}"
        );
        // A scripted crowd under 3/2 + 5 does climb to 100 and stay there.
        let mut mean = 50.0;
        for _ in 0..20 {
            mean = rule("3/2", "5")
                .score(&h(&[(1.5 * mean + 5.0f64).clamp(0.0, 100.0); 3]))
                .unwrap()
                .mean;
        }
        assert_eq!(mean, 100.0);
    }

    #[test]
    fn agents_without_a_guess_are_left_out() {
        let mut g = h(&[20.0, 40.0]);
        g.push(None);
        let r = rule("2/3", "0").score(&g).unwrap();
        assert_eq!((r.guesses, r.mean), (2, 30.0));
        assert!(rule("2/3", "0").score(&[None, None]).is_none());
    }

    #[test]
    fn guesses_round_to_their_decimals() {
        assert_eq!(to_hundredths(33.333, 2), 3333);
        assert_eq!(to_hundredths(33.35, 1), 3340);
        assert_eq!(to_hundredths(33.6, 0), 3400);
        assert_eq!(to_hundredths(120.0, 2), 10000);
        assert_eq!(to_hundredths(-3.0, 2), 0);
    }
}
