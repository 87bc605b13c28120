//! A position in one line of the text form, and the tokens read there.

use super::ParseError;
use crate::{DType, Index, IndexValue, Layout, MemorySpace, Order, TileType, ValueId};

/// A position in one line.
pub(super) struct Cursor<'a> {
    pub(super) text: &'a str,
    pub(super) at: usize,
    pub(super) line: u32,
    pub(super) indent: u32,
}

impl<'a> Cursor<'a> {
    pub(super) fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    pub(super) fn ws(&mut self) {
        let r = self.rest();
        self.at += r.len() - r.trim_start().len();
    }

    pub(super) fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            column: self.indent + self.at as u32 + 1,
            message: message.into(),
        }
    }

    /// An error about `token`, which ends at the cursor.
    pub(super) fn error_at(&self, token: &str, message: impl Into<String>) -> ParseError {
        let start = self.at.saturating_sub(token.len());
        ParseError {
            line: self.line,
            column: self.indent + start as u32 + 1,
            message: message.into(),
        }
    }

    pub(super) fn found(&self) -> String {
        match self.rest().trim_start() {
            "" => "the end of the line".into(),
            // Control characters and a byte-order mark are named, not
            // echoed (a raw CR would rewrite the terminal line).
            r => format!(
                "`{}`",
                r.chars()
                    .take(20)
                    .flat_map(|c| match c {
                        '\u{feff}' => "\\u{feff}".chars().collect::<Vec<_>>(),
                        c if c.is_control() => c.escape_default().collect(),
                        c => vec![c],
                    })
                    .collect::<String>()
            ),
        }
    }

    pub(super) fn eat(&mut self, s: &str) -> bool {
        if self.rest().starts_with(s) {
            self.at += s.len();
            true
        } else {
            false
        }
    }

    /// `s` after optional spaces.
    pub(super) fn sym(&mut self, s: &str) -> Result<(), ParseError> {
        self.ws();
        if self.eat(s) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{s}`, found {}", self.found())))
        }
    }

    /// The word `w`, if it is next (whole).
    pub(super) fn eat_word(&mut self, w: &str) -> bool {
        self.ws();
        let r = self.rest();
        if r.starts_with(w) && !r[w.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
        {
            self.at += w.len();
            true
        } else {
            false
        }
    }

    pub(super) fn word(&mut self, w: &str) -> Result<(), ParseError> {
        if self.eat_word(w) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{w}`, found {}", self.found())))
        }
    }

    pub(super) fn end(&mut self) -> Result<(), ParseError> {
        self.ws();
        if self.rest().is_empty() {
            Ok(())
        } else {
            Err(self.error(format!(
                "unexpected {} at the end of the line",
                self.found()
            )))
        }
    }

    pub(super) fn ident(&mut self) -> Result<&'a str, ParseError> {
        self.ws();
        let r = self.rest();
        let n = r
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(r.len());
        if n == 0 {
            return Err(self.error(format!("expected a word, found {}", self.found())));
        }
        self.at += n;
        Ok(&r[..n])
    }

    /// Everything up to the next space, comma or bracket.
    pub(super) fn token(&mut self) -> &'a str {
        self.ws();
        let r = self.rest();
        let n = r
            .find(|c: char| c.is_whitespace() || ",:()[]".contains(c))
            .unwrap_or(r.len());
        self.at += n;
        &r[..n]
    }

    /// `@name`.
    pub(super) fn name(&mut self) -> Result<&'a str, ParseError> {
        self.sym("@")?;
        self.ident()
    }

    pub(super) fn int(&mut self) -> Result<i64, ParseError> {
        self.ws();
        let r = self.rest();
        let n = r
            .char_indices()
            .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && c == '-')))
            .map_or(r.len(), |(i, _)| i);
        let t = &r[..n];
        let v = t
            .parse()
            .map_err(|_| self.error(format!("expected an integer, found {}", self.found())))?;
        self.at += n;
        Ok(v)
    }

    pub(super) fn usize(&mut self) -> Result<usize, ParseError> {
        let v = self.int()?;
        usize::try_from(v).map_err(|_| self.error(format!("expected a size ≥ 0, found {v}")))
    }

    /// `%N`.
    pub(super) fn value(&mut self) -> Result<ValueId, ParseError> {
        self.sym("%")?;
        let v = self.int()?;
        let max = crate::limits::MAX_VALUES;
        match u32::try_from(v) {
            Ok(n) if n < max => Ok(ValueId(n)),
            _ => Err(self.error(format!(
                "[limit] value `%{v}`: value numbers are 0 to {} (kernel_ir::limits::MAX_VALUES); number values from %0 up",
                max - 1
            ))),
        }
    }

    /// A number or a value.
    pub(super) fn index_value(&mut self) -> Result<IndexValue, ParseError> {
        self.ws();
        if self.rest().starts_with('%') {
            Ok(IndexValue::Dynamic(self.value()?))
        } else {
            Ok(IndexValue::Static(self.int()?))
        }
    }

    /// Items separated by commas, to the end of what they can take.
    pub(super) fn separated<T>(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Result<T, ParseError>,
    ) -> Result<Vec<T>, ParseError> {
        let mut out = vec![item(self)?];
        loop {
            self.ws();
            if !self.eat(",") {
                return Ok(out);
            }
            out.push(item(self)?);
        }
    }

    /// `open item, item close`, possibly empty.
    pub(super) fn list<T>(
        &mut self,
        open: char,
        close: char,
        mut item: impl FnMut(&mut Self) -> Result<T, ParseError>,
    ) -> Result<Vec<T>, ParseError> {
        self.sym(&open.to_string())?;
        self.ws();
        if self.eat(&close.to_string()) {
            return Ok(Vec::new());
        }
        let out = self.separated(&mut item)?;
        self.sym(&close.to_string())?;
        Ok(out)
    }

    pub(super) fn shape(&mut self) -> Result<Vec<usize>, ParseError> {
        self.list('[', ']', |c| c.usize())
    }

    pub(super) fn dtype(&mut self) -> Result<DType, ParseError> {
        let t = self.ident()?;
        t.parse().map_err(|e| self.error_at(t, format!("{e}")))
    }

    /// `f32` (a scalar) or `f32[8, 128]`.
    pub(super) fn tile_type(&mut self) -> Result<TileType, ParseError> {
        let dtype = self.dtype()?;
        let shape = if self.rest().starts_with('[') {
            self.shape()?
        } else {
            Vec::new()
        };
        Ok(TileType::new(dtype, shape))
    }

    pub(super) fn space(&mut self) -> Result<MemorySpace, ParseError> {
        let s = self.ident()?;
        match s {
            "vmem" => Ok(MemorySpace::Vmem),
            "smem" => Ok(MemorySpace::Smem),
            "any" => Ok(MemorySpace::Any),
            _ => Err(self.error_at(s, "expected a memory space: vmem, smem or any")),
        }
    }

    pub(super) fn layout(&mut self) -> Result<Layout, ParseError> {
        let o = self.ident()?;
        let order = match o {
            "row_major" => Order::RowMajor,
            "col_major" => Order::ColMajor,
            "minor_to_major" => Order::MinorToMajor(self.shape()?),
            _ => {
                return Err(self.error_at(
                    o,
                    "expected a layout: row_major, col_major or minor_to_major[..]",
                ));
            }
        };
        self.ws();
        let align = if self.eat(",") {
            self.word("align")?;
            Some(self.int()? as u64)
        } else {
            None
        };
        Ok(Layout { order, align })
    }

    /// `[0:8, %3:+128, 2, %5]`.
    pub(super) fn indices(&mut self) -> Result<Vec<Index>, ParseError> {
        self.list('[', ']', |c| {
            let start = c.index_value()?;
            if !c.eat(":") {
                return Ok(Index::Point(start));
            }
            match start {
                IndexValue::Static(s) => {
                    let end = c.int()?;
                    let len = usize::try_from(end - s)
                        .map_err(|_| c.error(format!("a slice {s}:{end} ends before it starts")))?;
                    Ok(Index::Slice { start, len })
                }
                IndexValue::Dynamic(_) => {
                    c.sym("+")?;
                    let len = c.usize()?;
                    Ok(Index::Slice { start, len })
                }
            }
        })
    }
}
