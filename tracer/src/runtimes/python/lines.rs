//! The line of an instruction, from a code object's line table.
//!
//! CPython 3.9 (Objects/lnotab_notes.txt of 3.9) keeps pairs of bytes in
//! `co_lnotab`: the bytecode offset's increment (unsigned), then the
//! line's (signed); an instruction's line is the sum of the line
//! increments of the pairs whose offsets it has reached, from
//! `co_firstlineno`.
//!
//! CPython 3.10 (Objects/lnotab_notes.txt of 3.10) keeps pairs of bytes in
//! `co_linetable`: the length in bytes of bytecode of a range (unsigned),
//! then the line's change from the previous range with a line (signed;
//! -128: the range has no line). Ranges follow each other from offset 0;
//! lines start at `co_firstlineno`.
//!
//! CPython 3.11+ (3.11, 3.12 and 3.13 alike) keeps a "location table" (`co_linetable`, described in
//! CPython's Objects/locations.md): a sequence of entries, each covering
//! 1-8 code units. An entry's first byte has its top bit set, a 4-bit code
//! (bits 3-6) and the number of code units minus one (bits 0-2); the code
//! says what follows:
//! - 15: no location (no line);
//! - 14: long form: line delta (signed varint), end-line delta, column + 1
//!   and end column + 1 (varints);
//! - 13: no columns: line delta (signed varint);
//! - 10-12: one-line form: line delta = code - 10, then column and end
//!   column (one byte each);
//! - 0-9: short form: same line, one byte of columns.
//!
//! Varints are 6-bit chunks, least significant first, bit 6 set on all but
//! the last; a signed varint is zigzag-like: `v >> 1`, negated when `v & 1`.
//! Lines start at `co_firstlineno`.

/// The line of the instruction at `offset` (in code units) in a 3.11+
/// location table; None when the entry has no line or the table ends first.
pub fn line_3_11(table: &[u8], first_line: i64, offset: u64) -> Option<u32> {
    let mut reader = Reader { table, at: 0 };
    let mut line = first_line;
    let mut start = 0u64;
    while let Some(first) = reader.byte() {
        if first & 0x80 == 0 {
            return None;
        }
        let code = (first >> 3) & 15;
        let units = u64::from(first & 7) + 1;
        let has_line = match code {
            15 => false,
            14 => {
                line += reader.signed()?;
                reader.unsigned()?;
                reader.unsigned()?;
                reader.unsigned()?;
                true
            }
            13 => {
                line += reader.signed()?;
                true
            }
            10..=12 => {
                line += i64::from(code - 10);
                reader.byte()?;
                reader.byte()?;
                true
            }
            _ => {
                reader.byte()?;
                true
            }
        };
        if (start..start + units).contains(&offset) {
            return (has_line && line >= 0).then_some(line as u32);
        }
        start += units;
    }
    None
}

/// The line of the instruction at byte `offset` (3.9's `f_lasti` counts
/// bytes) in a 3.9 `co_lnotab` (CPython 3.9's `PyCode_Addr2Line`).
pub fn line_3_9(table: &[u8], first_line: i64, offset: u64) -> Option<u32> {
    let mut line = first_line;
    let mut address = 0u64;
    for pair in table.chunks_exact(2) {
        address += u64::from(pair[0]);
        if address > offset {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    u32::try_from(line).ok()
}

/// The line of the instruction at `offset` (in code units, 2 bytes each)
/// in a 3.10 line table; None when its range has no line or the table
/// ends first.
pub fn line_3_10(table: &[u8], first_line: i64, offset: u64) -> Option<u32> {
    let byte_offset = offset * 2;
    let mut line = first_line;
    let mut end = 0u64;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let has_line = delta != -128;
        if has_line {
            line += i64::from(delta);
        }
        if (start..end).contains(&byte_offset) {
            return (has_line && line >= 0).then_some(line as u32);
        }
    }
    None
}

struct Reader<'a> {
    table: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.table.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    fn unsigned(&mut self) -> Option<u64> {
        let mut value = 0u64;
        let mut shift = 0;
        loop {
            let byte = self.byte()?;
            value |= u64::from(byte & 63) << shift;
            if byte & 64 == 0 {
                return Some(value);
            }
            shift += 6;
            if shift > 60 {
                return None;
            }
        }
    }

    fn signed(&mut self) -> Option<i64> {
        let value = self.unsigned()?;
        let magnitude = (value >> 1) as i64;
        Some(if value & 1 == 1 {
            -magnitude
        } else {
            magnitude
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `co_linetable` of this function compiled by Debian's python3.11
    /// (3.11.2) as example.py, with its `co_lines()` per code unit:
    /// ```python
    /// def leak(n):
    ///     x = [1]
    ///     if n:
    ///         y = x * n
    ///
    ///     return (x,
    ///             y)
    /// ```
    const TABLE_3_11: [u8; 42] = [
        128, 0, 216, 9, 10, 136, 3, 128, 65, 216, 7, 8, 240, 0, 1, 5, 18, 216, 12, 13, 144, 1, 137,
        69, 136, 1, 224, 12, 13, 216, 12, 13, 240, 3, 1, 12, 15, 240, 0, 1, 5, 15,
    ];
    const LINES_3_11: [u32; 15] = [1, 2, 2, 2, 3, 3, 4, 4, 4, 4, 4, 6, 7, 6, 6];

    #[test]
    fn decodes_a_real_3_11_location_table() {
        for (offset, &line) in LINES_3_11.iter().enumerate() {
            assert_eq!(
                line_3_11(&TABLE_3_11, 1, offset as u64),
                Some(line),
                "code unit {offset}"
            );
        }
        assert_eq!(line_3_11(&TABLE_3_11, 1, 15), None, "past the end");
    }

    /// `co_lnotab` of the same function compiled by Debian 11's python3.9
    /// (3.9.2), and its `dis.findlinestarts()`: (byte offset, line).
    const TABLE_3_9: [u8; 12] = [0, 1, 6, 1, 4, 1, 8, 2, 2, 1, 2, 255];
    const LINE_STARTS_3_9: [(u64, u32); 6] = [(0, 2), (6, 3), (10, 4), (18, 6), (20, 7), (22, 6)];
    /// `len(co_code)`.
    const CODE_BYTES_3_9: u64 = 26;

    #[test]
    fn decodes_a_real_3_9_line_number_table() {
        for (index, &(start, line)) in LINE_STARTS_3_9.iter().enumerate() {
            let end = LINE_STARTS_3_9
                .get(index + 1)
                .map_or(CODE_BYTES_3_9, |&(next, _)| next);
            for offset in start..end {
                assert_eq!(line_3_9(&TABLE_3_9, 1, offset), Some(line), "byte {offset}");
            }
        }
    }

    /// The same function compiled by pyenv's CPython 3.12.1 and 3.13.0
    /// (built from python.org sources on this machine), with `co_lines()`.
    const TABLE_3_12: [u8; 37] = [
        128, 0, 216, 9, 10, 136, 3, 128, 65, 217, 7, 8, 216, 12, 13, 144, 1, 137, 69, 136, 1, 224,
        12, 13, 216, 12, 13, 240, 3, 1, 12, 15, 240, 0, 1, 5, 15,
    ];
    const TABLE_3_13: [u8; 35] = [
        128, 0, 216, 9, 10, 136, 3, 128, 65, 222, 7, 8, 216, 12, 13, 137, 69, 136, 1, 224, 12, 13,
        216, 12, 13, 240, 3, 1, 12, 15, 240, 0, 1, 5, 15,
    ];
    const LINES_3_13: [u32; 19] = [1, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 6, 7, 6, 6];

    #[test]
    fn decodes_real_3_12_and_3_13_location_tables() {
        for (table, lines) in [
            (&TABLE_3_12[..], &LINES_3_11[..]),
            (&TABLE_3_13, &LINES_3_13),
        ] {
            for (offset, &line) in lines.iter().enumerate() {
                assert_eq!(
                    line_3_11(table, 1, offset as u64),
                    Some(line),
                    "unit {offset}"
                );
            }
        }
    }

    /// `co_linetable` of this function compiled by pyenv's CPython 3.10.13
    /// (built from python.org sources on this machine) as example.py, and
    /// its `co_lines()`: (start byte, end byte, line).
    /// ```python
    /// def handle(work):
    ///     try:
    ///         work()
    ///     except ValueError as error:
    ///         print(error)
    ///     with open("x") as f:
    ///         pass
    /// ```
    const TABLE_3_10: [u8; 18] = [
        2, 1, 10, 1, 14, 1, 20, 1, 8, 128, 2, 255, 10, 2, 2, 1, 34, 255,
    ];
    const LINES_3_10: [(u64, u64, Option<u32>); 9] = [
        (0, 2, Some(2)),
        (2, 12, Some(3)),
        (12, 26, Some(4)),
        (26, 46, Some(5)),
        (46, 54, None),
        (54, 56, Some(4)),
        (56, 66, Some(6)),
        (66, 68, Some(7)),
        (68, 102, Some(6)),
    ];

    #[test]
    fn decodes_a_real_3_10_line_table() {
        for (start, end, line) in LINES_3_10 {
            for byte in (start..end).step_by(2) {
                assert_eq!(
                    line_3_10(&TABLE_3_10, 1, byte / 2),
                    line,
                    "code unit {} (byte {byte})",
                    byte / 2
                );
            }
        }
        assert_eq!(line_3_10(&TABLE_3_10, 1, 51), None, "past the end");
        // The same table read as 3.11's format is wrong: the format matters.
        assert_ne!(line_3_11(&TABLE_3_10, 1, 1), Some(3));
    }

    /// `leak` (above) compiled by 3.10.13 at line 41 of a file, with
    /// `co_lines()` [(0, 6, 42), (6, 10, 43), (10, 18, 44), (18, 20, 46),
    /// (20, 22, 47), (22, 26, 46)].
    #[test]
    fn decodes_3_10_from_a_first_line_that_is_not_1() {
        let table = [6, 1, 4, 1, 8, 1, 2, 2, 2, 1, 4, 255];
        let lines: Vec<Option<u32>> = (0..13).map(|unit| line_3_10(&table, 41, unit)).collect();
        let expected = [42, 42, 42, 43, 43, 44, 44, 44, 44, 46, 47, 46, 46].map(Some);
        assert_eq!(lines, expected);
    }

    #[test]
    fn no_location_entries_have_no_line() {
        // Code 15 over 2 units, then a short-form entry over 1 unit.
        let table = [0x80 | (15 << 3) | 1, 0x80, 0];
        assert_eq!(line_3_11(&table, 10, 0), None);
        assert_eq!(line_3_11(&table, 10, 2), Some(10));
    }
}
