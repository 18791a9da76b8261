//! What keeps the target safe from tracer's probes: C++ exceptions
//! through return-probed frames (`exceptions`, the one write tracer makes
//! into a target), the return probes held back until the unwinder is
//! probed (`held_back`), and the watchdog that lets held processes go on
//! if tracer dies (`watchdog`).
pub mod exceptions;
pub mod held_back;
pub mod watchdog;
