//! Errors of the compiler, one variant per stage.

use crate::tirh::SourceLoc;

/// Everything that can go wrong while compiling a kernel.
///
/// Each variant carries the [`SourceLoc`] of the offending DSL token, which the macro maps
/// back to a `Span`.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum CompileError {
    /// The kernel is not well-typed: a shape, dtype or rank does not match.
    #[error("{message}")]
    Type {
        /// What was expected and what was found.
        message: String,
        /// Where.
        loc: SourceLoc,
    },
    /// The kernel uses something the lowering for this target cannot express.
    #[error("{message}")]
    Lower {
        /// What is unsupported.
        message: String,
        /// Where.
        loc: SourceLoc,
    },
}

impl CompileError {
    /// Where in the DSL source the error points.
    pub fn loc(&self) -> SourceLoc {
        match self {
            CompileError::Type { loc, .. } | CompileError::Lower { loc, .. } => *loc,
        }
    }

    pub(crate) fn ty(loc: SourceLoc, message: impl Into<String>) -> Self {
        CompileError::Type { message: message.into(), loc }
    }
}
