//! Chooses where in a function its probes go, so that the kernel emulates
//! the probed instruction instead of single-stepping it.
//!
//! A uprobe on an instruction the kernel cannot emulate costs a single-step
//! trap: ~16 µs per call on a VM instead of ~0.45 µs (KERNEL-NOTES.md).
//! glibc's `free` starts with `test %rdi,%rdi; je`, `posix_memalign` with a
//! `cmpb` on a global. So the first instructions are decoded, and the probe
//! moves past those that are safe to step over — they neither branch (but
//! for a NULL check of the first argument, where only the call with NULL
//! is skipped, and only where `skip_null_check` allows it), nor write an
//! argument register or the stack pointer — to the first instruction the
//! kernel emulates (`push` of a register). Anything else: the entry.
//!
//! Since neither the arguments nor the stack pointer changed, an entry
//! probe reads the same arguments there and a return probe still finds the
//! return address at the top of the stack.

/// Where a function's probes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSite {
    /// Bytes after the function's entry.
    pub offset: u64,
    /// Whether the kernel emulates the instruction there (cheap), or must
    /// single-step it (expensive).
    pub emulated: bool,
}

/// How far past the entry to look.
const MAX_SKIP_BYTES: usize = 32;

/// Decodes the start of a function (`code`, from its entry) and returns
/// where to probe it. `skip_null_check`: a `test %rdi,%rdi; je` pair may be
/// stepped over (only calls with a NULL first argument miss the probe).
pub fn choose_site(code: &[u8], skip_null_check: bool) -> ProbeSite {
    let mut offset = 0;
    let mut after_rdi_test = false;
    while offset < code.len().min(MAX_SKIP_BYTES) {
        let rest = &code[offset..];
        if is_emulated(rest) {
            return ProbeSite {
                offset: offset as u64,
                emulated: true,
            };
        }
        let length = match rest {
            // test %rdi,%rdi / test %rsi,%rsi: flags only.
            [0x48, 0x85, 0xff, ..] => {
                after_rdi_test = true;
                offset += 3;
                continue;
            }
            [0x48, 0x85, 0xf6, ..] => 3,
            // cmpb $imm8, disp32(%rip): flags only.
            [0x80, 0x3d, _, _, _, _, _, ..] => 7,
            // endbr64: no effect outside CET.
            [0xf3, 0x0f, 0x1e, 0xfa, ..] => 4,
            // mov $imm32,%eax: rax carries no argument.
            [0xb8, _, _, _, _, ..] => 5,
            // je after testing the first argument for NULL.
            [0x74, _, ..] if skip_null_check && after_rdi_test => 2,
            [0x0f, 0x84, _, _, _, _, ..] if skip_null_check && after_rdi_test => 6,
            _ => break,
        };
        after_rdi_test = false;
        offset += length;
    }
    ProbeSite {
        offset: 0,
        emulated: is_emulated(code),
    }
}

/// `push %reg` (and `push %r8`..`%r15`), relative `call` and `jmp`: the
/// kernel emulates these.
fn is_emulated(code: &[u8]) -> bool {
    matches!(
        code,
        [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] | [0xe8 | 0xe9, _, _, _, _, ..] | [0xeb, _, ..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_236_free_moves_past_the_null_check() {
        // test %rdi,%rdi; je +0xbf; push %rbp; lea -0x10(%rdi),%rsi
        let code = [
            0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0, 0x55, 0x48, 0x8d, 0x77, 0xf0,
        ];
        assert_eq!(
            choose_site(&code, true),
            ProbeSite {
                offset: 9,
                emulated: true
            }
        );
        // Where skipping a branch is not allowed, stay at the entry.
        assert_eq!(
            choose_site(&code, false),
            ProbeSite {
                offset: 0,
                emulated: false
            }
        );
    }

    #[test]
    fn push_at_entry_stays() {
        // malloc: push %r12; push %rbp
        assert_eq!(
            choose_site(&[0x41, 0x54, 0x55], false),
            ProbeSite {
                offset: 0,
                emulated: true
            }
        );
    }

    #[test]
    fn posix_memalign_moves_past_cmpb() {
        // cmpb $0x0,0x140201(%rip); push %r12
        let code = [0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00, 0x41, 0x54];
        assert_eq!(
            choose_site(&code, false),
            ProbeSite {
                offset: 7,
                emulated: true
            }
        );
    }

    #[test]
    fn a_branch_or_a_register_write_stops_the_search() {
        // memalign: cmpb ...; je; jmp  -> the je may skip the site: entry.
        let code = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0x00, 0x00, 0x74, 0x07, 0x55];
        assert_eq!(
            choose_site(&code, true),
            ProbeSite {
                offset: 0,
                emulated: false
            }
        );
        // reallocarray: mov %rsi,%rax; ... writes a register: entry.
        let code = [0x48, 0x89, 0xf0, 0x55];
        assert_eq!(
            choose_site(&code, false),
            ProbeSite {
                offset: 0,
                emulated: false
            }
        );
    }

    #[test]
    fn libstdcxx_operator_new_moves_to_its_push() {
        // _Znwm: endbr64; test %rdi,%rdi; mov $0x1,%eax; push %rbx
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0xb8, 1, 0, 0, 0, 0x53,
        ];
        assert_eq!(
            choose_site(&code, false),
            ProbeSite {
                offset: 12,
                emulated: true
            }
        );
        // _Znam: endbr64; jmp _Znwm
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0xe9, 0x93, 0xff, 0xff, 0xff];
        assert_eq!(
            choose_site(&code, false),
            ProbeSite {
                offset: 4,
                emulated: true
            }
        );
    }

    #[test]
    fn endbr64_is_stepped_over() {
        assert_eq!(
            choose_site(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55], false),
            ProbeSite {
                offset: 4,
                emulated: true
            }
        );
    }
}
