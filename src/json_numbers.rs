//! Long arrays of numbers written as JSON text directly. A prompt's ids go to the backend every
//! turn and whole nodes to the trainer; through serde each number cost several times more,
//! mostly in one tiny copy per number into the output.

/// Writes one JSON array: numbers gather in a small stack buffer that is flushed every few
/// hundred bytes. [`NumberArray::finish`] closes the array.
pub struct NumberArray<'a> {
    out: &'a mut Vec<u8>,
    chunk: [u8; 1024],
    at: usize,
    empty: bool,
}

/// Longest item: a ten-digit id or a formatted float, and the comma.
const ITEM_MAX: usize = 40;

impl<'a> NumberArray<'a> {
    /// Opens an array at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'[');
        Self {
            out,
            chunk: [0; 1024],
            at: 0,
            empty: true,
        }
    }

    fn separate(&mut self) {
        if self.at + ITEM_MAX > self.chunk.len() {
            self.out.extend_from_slice(&self.chunk[..self.at]);
            self.at = 0;
        }
        if !self.empty {
            self.chunk[self.at] = b',';
            self.at += 1;
        }
        self.empty = false;
    }

    /// Appends an unsigned integer.
    pub fn id(&mut self, n: u32) {
        self.separate();
        let len = decimal_len(n);
        write_decimal(&mut self.chunk[self.at..self.at + len], n);
        self.at += len;
    }

    /// Appends a number already in JSON form (e.g. `-100`, `1.0`); at most 39 bytes.
    pub fn literal(&mut self, text: &[u8]) {
        debug_assert!(text.len() < ITEM_MAX);
        self.separate();
        self.chunk[self.at..self.at + text.len()].copy_from_slice(text);
        self.at += text.len();
    }

    /// Appends a float as serde_json writes it (shortest round-trip form; `null` if not
    /// finite).
    pub fn float(&mut self, value: f64) {
        let mut text = Vec::with_capacity(24);
        match serde_json::to_writer(&mut text, &value) {
            Ok(()) => self.literal(&text),
            Err(_) => self.literal(b"null"),
        }
    }

    /// Closes the array.
    pub fn finish(self) {
        self.out.extend_from_slice(&self.chunk[..self.at]);
        self.out.push(b']');
    }
}

/// Two decimal digits for each value below 100.
const DIGIT_PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Digits of `n`; token ids are mostly five or six digits, so the branches predict well.
fn decimal_len(n: u32) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        1_000..=9_999 => 4,
        10_000..=99_999 => 5,
        100_000..=999_999 => 6,
        1_000_000..=9_999_999 => 7,
        10_000_000..=99_999_999 => 8,
        100_000_000..=999_999_999 => 9,
        _ => 10,
    }
}

/// Writes `n` into `digits`, which is exactly as long as its decimal form.
fn write_decimal(digits: &mut [u8], mut n: u32) {
    let mut end = digits.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        digits[end - 2] = DIGIT_PAIRS[pair];
        digits[end - 1] = DIGIT_PAIRS[pair + 1];
        end -= 2;
    }
    if n >= 10 {
        let pair = n as usize * 2;
        digits[end - 2] = DIGIT_PAIRS[pair];
        digits[end - 1] = DIGIT_PAIRS[pair + 1];
    } else {
        digits[end - 1] = b'0' + n as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn arrays_read_back_as_serde_writes_them() {
        let ids = [
            0,
            7,
            9,
            10,
            42,
            99,
            100,
            101,
            999,
            1000,
            65_535,
            151_643,
            u32::MAX,
        ];
        let mut out = Vec::new();
        let mut array = NumberArray::new(&mut out);
        // Enough items to flush the stack buffer several times.
        for _ in 0..300 {
            ids.iter().for_each(|&id| array.id(id));
        }
        array.literal(b"-100");
        array.float(-0.25);
        array.float(1.0);
        array.float(f64::NAN);
        array.float(f64::from(-1.234_567_9_f32));
        array.finish();
        let parsed: Value = serde_json::from_slice(&out).unwrap();
        let mut expected: Vec<Value> = (0..300).flat_map(|_| ids.map(|id| json!(id))).collect();
        expected.extend([
            json!(-100),
            json!(-0.25),
            json!(1.0),
            Value::Null,
            json!(f64::from(-1.234_567_9_f32)),
        ]);
        assert_eq!(parsed, Value::Array(expected));
        assert!(out.ends_with(b",-100,-0.25,1.0,null,-1.2345678806304932]"));

        let mut empty = Vec::new();
        NumberArray::new(&mut empty).finish();
        assert_eq!(empty, b"[]");
    }
}
