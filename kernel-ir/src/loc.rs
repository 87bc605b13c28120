//! Source locations of ops and declarations.

use std::borrow::Cow;
use std::fmt;

/// Where in the user's source an op or declaration was written.
///
/// The builder fills it from `#[track_caller]`, so it names the user's
/// expression, not a line inside Tessera.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Source file as the compiler saw it.
    pub file: Cow<'static, str>,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

impl Loc {
    /// The location of the caller of the `#[track_caller]` function that
    /// calls this.
    #[track_caller]
    pub fn caller() -> Loc {
        Loc::from(std::panic::Location::caller())
    }
}

impl From<&'static std::panic::Location<'static>> for Loc {
    fn from(l: &'static std::panic::Location<'static>) -> Self {
        Loc {
            file: Cow::Borrowed(l.file()),
            line: l.line(),
            column: l.column(),
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}
