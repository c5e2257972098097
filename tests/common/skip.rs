//! A skipped test that says so.

/// Says that a test skipped where the person running the tests sees it: cargo hides the
/// output of passing tests, so the message goes to the terminal itself when there is one.
pub fn loud_skip(why: &str) {
    use std::io::Write;
    let text = format!("\n{0}\nSKIPPED: {why}\n{0}\n", "!".repeat(78));
    eprint!("{text}");
    if let Ok(mut tty) = std::fs::OpenOptions::new().write(true).open("/dev/tty") {
        let _ = tty.write_all(text.as_bytes());
    }
}
