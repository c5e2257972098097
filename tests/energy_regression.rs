//! Guards the energy market's records across restructures of the simulation layer: the same
//! config and seed must give the same bytes as the code that produced the reference hashes.
//! A change that alters these records on purpose (a new column, a rule fixed) updates the
//! hashes in the same commit and says why there.
//!
//! Hashes taken at d7abf78, before the simulation layer was reshaped for a second scenario.
//! Re-taken on purpose since:
//! - the reference fixture's state (issue 9): `rules = "reference"` now models the hidden
//!   round with demand 0 that the published code runs before step 1, so step 1 of every
//!   cell is that round (utilities buy nothing and charge 0; producers are paid for what they
//!   make) and demand first moves after step 2. Its decisions are unchanged: the scripted
//!   policy decides the same with or without that round.
//! - the fixed fixture's records (issue 9): in a control arm (use_personas = false) the
//!   scripted policy no longer acts on personas its prompt would not mention, so every
//!   control utility follows the neutral rule (margin 15%, renewable preference 2). Only the
//!   control arm's rows and decisions changed; the personas arm's are identical.

mod common;

fn check(config: &str, [state, csv, decisions]: [&str; 3]) {
    common::regression::check(
        config,
        &[
            ("state.parquet", state),
            ("state.csv", csv),
            ("decisions.jsonl", decisions),
        ],
    );
}

#[test]
fn fixed_rules_records_are_unchanged() {
    check(
        "energy-fixed.toml",
        [
            "09f34685b28f7f0c0e1c8242097845dc7de9984210b976ff857f067a87efdb22",
            "042c0423f77ed62ef68a8a7e8be2f2aa79ffd66822cab3e70a3bb186abb59094",
            "f981774d2c04d23cb7fba82afdf164f689bca32972d6b12714c1e0a9c3a5e0d6",
        ],
    );
}

#[test]
fn reference_rules_records_are_unchanged() {
    check(
        "energy-reference.toml",
        [
            "7ce91409501a0cf162e373d0523765ade52c092ca3f517adda0c0140a8be13f3",
            "4f94593763e5198bbb9dbdb32e55cd64d08a60f6d0d9cdee019d0b01111e7318",
            "80f2e4d1ce829bc454acfeac25bf866bb9a5c5dd19d8f1c8d6582f0c29076b63",
        ],
    );
}
