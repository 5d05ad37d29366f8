//! Each misuse of the DSL is a compile error at the offending token, saying what was expected
//! and what was found. `TRYBUILD=overwrite cargo test --test ui` regenerates the `.stderr`
//! files; read the diff as you would docs.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
