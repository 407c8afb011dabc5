//! `edit --jq`: a jq program (the `jaq` interpreter) over a JSON body. Its output is
//! never written back as it is: only what it changed is spliced onto the stored text
//! ([`super::patch`]), so numbers, escapes, key order and whitespace it did not touch stay
//! exactly as they were, whatever the interpreter does with them.

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{data, unwrap_valr, Compiler, Ctx, Vars};
use jaq_json::{read, Val};

/// Why a program gave no new body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JqError {
    /// The program does not parse or compile (the interpreter's words).
    Program(String),
    /// It failed on this body (the interpreter's words).
    Failed(String),
    /// It yielded no value, or more than one (how many, at most 2).
    Yields(usize),
}

/// A compiled program, run on each body of a plan.
pub struct Program {
    filter: jaq_core::Filter<data::JustLut<Val>>,
}

impl Program {
    pub fn compile(code: &str) -> Result<Program, JqError> {
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs());
        let loader = Loader::new(defs);
        let arena = Arena::default();
        let program = File { code, path: () };
        let modules = loader
            .load(&arena, program)
            .map_err(|e| JqError::Program(format!("cannot parse the program: {e:?}")))?;
        let filter = Compiler::default()
            .with_funs(funs)
            .compile(modules)
            .map_err(|e| JqError::Program(format!("cannot compile the program: {e:?}")))?;
        Ok(Program { filter })
    }

    /// Runs the program on a JSON text: the one value it yields, as JSON text.
    pub fn run(&self, input: &str) -> Result<String, JqError> {
        let value = read::parse_single(input.as_bytes())
            .map_err(|e| JqError::Failed(format!("the body is not JSON: {e}")))?;
        let ctx = Ctx::<data::JustLut<Val>>::new(&self.filter.lut, Vars::new([]));
        let mut out = self.filter.id.run((ctx, value)).map(unwrap_valr);
        let first = match out.next() {
            None => return Err(JqError::Yields(0)),
            Some(Err(e)) => return Err(JqError::Failed(e.to_string())),
            Some(Ok(v)) => v,
        };
        if out.next().is_some() {
            return Err(JqError::Yields(2));
        }
        Ok(first.to_string())
    }
}
