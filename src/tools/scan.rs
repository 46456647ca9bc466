//! Small scanners shared by the parsers.

/// The end (exclusive) of the bracketed JSON value starting at `start`, strings respected.
pub fn balanced(text: &str, start: usize) -> Option<usize> {
    balanced_quoted(text, start, &['"'])
}

/// Like [`balanced`], with strings opened by any of `quotes` (and closed by the same one).
pub fn balanced_quoted(text: &str, start: usize, quotes: &[char]) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text[start..].char_indices() {
        if let Some(open) = quote {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, c) if c == open => quote = None,
                _ => {}
            }
            continue;
        }
        match c {
            c if quotes.contains(&c) => quote = Some(c),
            '[' | '{' | '(' => depth += 1,
            ']' | '}' | ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(start + i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Length of the JSON string literal `text` starts with (quotes included), if it closes.
pub fn balanced_string(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '"') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// A read position in text, for the formats whose arguments are read piece by piece. Each
/// such format adds its syntax as methods on `Cursor<'_, ItsMarker>`.
pub struct Cursor<'a, Syntax> {
    pub text: &'a str,
    pub pos: usize,
    syntax: std::marker::PhantomData<Syntax>,
}

impl<'a, Syntax> Cursor<'a, Syntax> {
    pub fn new(text: &'a str, pos: usize) -> Self {
        Self {
            text,
            pos,
            syntax: std::marker::PhantomData,
        }
    }

    /// The text not read yet.
    pub fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    pub fn skip_space(&mut self) {
        self.pos += leading_space(self.rest());
    }
}

/// Bytes of leading whitespace in `text`.
pub fn leading_space(text: &str) -> usize {
    text.len() - text.trim_start().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_inside_strings_do_not_count() {
        assert_eq!(balanced(r#"{"a": "}"} x"#, 0), Some(10));
        assert_eq!(balanced(r#"{"a": "\"}"#, 0), None);
        assert_eq!(balanced_quoted("[f(a=')')] x", 0, &['"', '\'']), Some(10));
    }
}
