//! Long arrays of numbers written as JSON text directly. A prompt's ids go to the backend every
//! turn and whole nodes to the trainer; through serde each number cost several times more,
//! mostly in one tiny copy per number into the output.

use std::sync::LazyLock;

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

/// Room an id takes while written: eight bytes stored at once, or a comma and ten digits.
const ID_MAX: usize = 11;

/// Items copied at once by [`NumberArray::repeat`].
const REPEAT_BLOCK: usize = 64;

/// Ids written between checks for room in the stack buffer.
const IDS_PER_BATCH: usize = 32;

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

    /// Makes room for `bytes` more bytes.
    fn reserve(&mut self, bytes: usize) {
        if self.at + bytes > self.chunk.len() {
            self.out.extend_from_slice(&self.chunk[..self.at]);
            self.at = 0;
        }
    }

    fn separate(&mut self) {
        self.reserve(ITEM_MAX);
        if !self.empty {
            self.chunk[self.at] = b',';
            self.at += 1;
        }
        self.empty = false;
    }

    /// Appends an unsigned integer.
    pub fn id(&mut self, n: u32) {
        self.reserve(ITEM_MAX);
        self.at += write_id(&mut self.chunk[self.at..], n, !self.empty);
        self.empty = false;
    }

    /// Appends unsigned integers, a batch at a time with the write position kept local.
    pub fn ids(&mut self, ids: &[u32]) {
        let Some((&first, rest)) = ids.split_first() else {
            return;
        };
        self.id(first);
        let table = &**ID_TEXT;
        for batch in rest.chunks(IDS_PER_BATCH) {
            self.reserve(IDS_PER_BATCH * ID_MAX);
            let mut at = self.at;
            for &n in batch {
                at += match table.get(n as usize) {
                    Some(&text) => store_text(&mut self.chunk[at..], text, true),
                    None => write_long_id(&mut self.chunk[at..], n, true),
                };
            }
            self.at = at;
        }
    }

    /// Appends a number already in JSON form (e.g. `-100`, `1.0`); at most 39 bytes.
    pub fn literal(&mut self, text: &[u8]) {
        debug_assert!(text.len() < ITEM_MAX);
        self.separate();
        self.chunk[self.at..self.at + text.len()].copy_from_slice(text);
        self.at += text.len();
    }

    /// Appends `count` copies of a number already in JSON form (at most 39 bytes): the runs of
    /// `-100` and `1.0` that fill most of a node's arrays.
    pub fn repeat(&mut self, text: &[u8], count: usize) {
        if count == 0 {
            return;
        }
        self.literal(text);
        let rest = count - 1;
        let mut item = Vec::with_capacity(text.len() + 1);
        item.push(b',');
        item.extend_from_slice(text);
        let block = item.repeat(rest.min(REPEAT_BLOCK));
        self.out.extend_from_slice(&self.chunk[..self.at]);
        self.at = 0;
        self.out.reserve(rest * item.len());
        for _ in 0..rest / REPEAT_BLOCK {
            self.out.extend_from_slice(&block);
        }
        self.out
            .extend_from_slice(&block[..(rest % REPEAT_BLOCK) * item.len()]);
    }

    /// Appends a float as serde_json writes it (shortest round-trip form; `null` if not
    /// finite).
    pub fn float(&mut self, value: f64) {
        let mut text = [0u8; ITEM_MAX];
        let mut unused: &mut [u8] = &mut text;
        match serde_json::to_writer(&mut unused, &value) {
            Ok(()) => {
                let written = ITEM_MAX - unused.len();
                self.literal(&text[..written]);
            }
            Err(_) => self.literal(b"null"),
        }
    }

    /// Closes the array.
    pub fn finish(self) {
        self.out.extend_from_slice(&self.chunk[..self.at]);
        self.out.push(b']');
    }
}

/// Ids below this (every vocabulary in use: Gemma's 262,144 is the largest) are written from
/// [`ID_TEXT`].
const TABLE_IDS: u32 = 1 << 18;

/// Each id below [`TABLE_IDS`] as array text, packed in a `u64`: a comma and at most six digits
/// in the low bytes (first byte lowest), their count in the top byte. Storing eight bytes and
/// moving on by that count is several times faster than dividing an id into digits, and a
/// prompt's ids are written every turn. 2 MiB, built on first use (a few milliseconds).
static ID_TEXT: LazyLock<Box<[u64]>> = LazyLock::new(|| {
    (0..TABLE_IDS)
        .map(|n| {
            let mut text = [0u8; 8];
            let len = write_long_id(&mut text, n, true);
            text[7] = len as u8;
            u64::from_le_bytes(text)
        })
        .collect()
});

/// Writes `n` (with a comma first if `comma`) at the start of `out`, which has room for
/// `ITEM_MAX` bytes, and returns the length written; later bytes may be overwritten.
fn write_id(out: &mut [u8], n: u32, comma: bool) -> usize {
    match ID_TEXT.get(n as usize) {
        Some(&text) => store_text(out, text, comma),
        None => write_long_id(out, n, comma),
    }
}

/// Stores an [`ID_TEXT`] entry, dropping its comma unless `comma`.
#[inline]
fn store_text(out: &mut [u8], text: u64, comma: bool) -> usize {
    let len = (text >> 56) as usize;
    let bytes = text & 0x00FF_FFFF_FFFF_FFFF;
    let skip = usize::from(!comma);
    out[..8].copy_from_slice(&(bytes >> (8 * skip)).to_le_bytes());
    len - skip
}

/// Writes `n` by dividing it into digits (a comma first if `comma`); returns the length.
fn write_long_id(out: &mut [u8], n: u32, comma: bool) -> usize {
    let start = usize::from(comma);
    out[0] = b',';
    let len = decimal_len(n);
    write_decimal(&mut out[start..start + len], n);
    start + len
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
    fn floats_are_written_as_serde_json_writes_them() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut values = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            1e-7,
            1e300,
            f64::MIN_POSITIVE,
            f64::MAX,
        ];
        values.extend((0..20_000).map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            f64::from_bits(seed)
        }));
        values.extend((0..20_000).map(|i| f64::from(-(i as f32) / 997.0)));
        for value in values {
            let mut out = Vec::new();
            let mut array = NumberArray::new(&mut out);
            array.float(value);
            array.finish();
            let expected = format!("[{}]", serde_json::to_string(&value).unwrap());
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
    }

    #[test]
    fn every_id_reads_back_alone_first_and_after_others() {
        let spread = (0..20_000u32).map(|i| i.wrapping_mul(2_654_435_761));
        let ids: Vec<u32> = (0..TABLE_IDS + 1_000).chain(spread).collect();
        for (first, rest) in [(&ids[..0], &ids[..]), (&ids[..1], &ids[1..])] {
            let mut out = Vec::new();
            let mut array = NumberArray::new(&mut out);
            first.iter().for_each(|&id| array.id(id));
            array.ids(rest);
            array.finish();
            assert_eq!(serde_json::from_slice::<Vec<u32>>(&out).unwrap(), ids);
        }
        for id in [0, 9, 10, TABLE_IDS - 1, TABLE_IDS, u32::MAX] {
            let mut out = Vec::new();
            let mut array = NumberArray::new(&mut out);
            array.ids(&[id]);
            array.finish();
            assert_eq!(out, format!("[{id}]").as_bytes());
        }
    }

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
        array.repeat(b"1.0", 0);
        array.repeat(b"-100", 1);
        array.repeat(b"1.0", 150);
        array.float(-0.25);
        array.float(1.0);
        array.float(f64::NAN);
        array.float(f64::from(-1.234_567_9_f32));
        array.finish();
        let parsed: Value = serde_json::from_slice(&out).unwrap();
        let mut expected: Vec<Value> = (0..300).flat_map(|_| ids.map(|id| json!(id))).collect();
        expected.push(json!(-100));
        expected.push(json!(-100));
        expected.extend((0..150).map(|_| json!(1.0)));
        expected.extend([
            json!(-0.25),
            json!(1.0),
            Value::Null,
            json!(f64::from(-1.234_567_9_f32)),
        ]);
        assert_eq!(parsed, Value::Array(expected));
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with(&format!(
            ",-100,-100{},-0.25,1.0,null,-1.2345678806304932]",
            ",1.0".repeat(150)
        )));

        let mut empty = Vec::new();
        NumberArray::new(&mut empty).finish();
        assert_eq!(empty, b"[]");
    }
}
