//! Symbol lookup and probe-site choice: which functions tracer hooks
//! (`function`, and the families runtimes register: `family`), where
//! each is defined in the objects a target maps (`symbols`), which ones
//! need no probe because they pass their call on (`forwarding`), and
//! where in a function its probe goes so the kernel emulates the probed
//! instruction (`prologue`).
pub mod family;
pub mod forwarding;
pub mod function;
pub mod prologue;
pub mod symbols;
