//! An error's message and its chain of causes, as every edge prints them (the command line,
//! a rank's log line, a Python exception): each cause whose words the one above it already
//! gave is left out, since a wrapping error often repeats its source's text.

use std::error::Error;

/// `e`'s message, then each cause that says something the one above it did not.
pub fn causes(e: &(dyn Error + 'static)) -> Vec<String> {
    let mut said = vec![e.to_string()];
    let mut last = said[0].clone();
    let mut cause = e.source();
    while let Some(c) = cause {
        let words = c.to_string();
        if !last.contains(&words) {
            said.push(words.clone());
        }
        last = words;
        cause = c.source();
    }
    said
}

#[cfg(test)]
mod tests {
    use super::causes;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Wrapped(
        String,
        #[source] Option<Box<dyn std::error::Error + Send + Sync>>,
    );

    #[test]
    fn a_cause_the_message_above_already_gave_is_left_out() {
        let io = std::io::Error::other("disk full");
        let repeated = Wrapped("writing state: disk full".into(), Some(Box::new(io)));
        let top = Wrapped("step 3 failed".into(), Some(Box::new(repeated)));
        assert_eq!(causes(&top), ["step 3 failed", "writing state: disk full"]);
        let plain = Wrapped("no such model".into(), None);
        assert_eq!(causes(&plain), ["no such model"]);
    }
}
