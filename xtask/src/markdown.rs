//! What the documentation's checks read of a Markdown page: its prose outside fenced code
//! blocks, and text with its code spans taken out (all of them, or all but those a check wants
//! to keep).

/// The text of a page outside fenced code blocks, line by line.
pub fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// `text` without its code spans, but for those `keep` says to keep (their backticks dropped).
pub fn without_code(text: &str, keep: impl Fn(&str) -> bool) -> String {
    text.split('`')
        .enumerate()
        .filter(|(i, part)| i % 2 == 0 || keep(part))
        .map(|(_, part)| part)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_blocks_and_code_spans_are_left_out() {
        let text = "a `b` c\n```\nd\n```\ne `f` `g`\n";
        let prose: Vec<&str> = prose(text).collect();
        assert_eq!(prose, ["a `b` c", "e `f` `g`"]);
        assert_eq!(without_code(prose[1], |_| false), "e  ");
        assert_eq!(without_code(prose[1], |span| span == "g"), "e  g");
    }
}
