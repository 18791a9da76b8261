//! Labels that tell listed entries apart. A site label names the code
//! that asked for the memory (`run_reproducer (s1_repro.py:12) via
//! ResNetForImageClassification.__init__`); entries listed one per stack
//! (`--group-by stack`, a run of too many stacks to group, the metrics,
//! `top`) often share it while being different call paths, such as the
//! weights of different layers of one model. Where listed entries would
//! read the same, each label grows by the first frame, from the thread's
//! start inward, where its stack leaves the others (`through
//! ResNetBottleNeckLayer.__init__ (modeling_resnet.py:164)`): the branch
//! point of their call paths.

use std::collections::HashMap;

use super::site::frame_label;
use crate::model::Frame;

/// For entries listed together, each a label and its stack's frames
/// (innermost first): the frame, as labelled, that tells it apart from
/// the entries with the same label; None where no other entry has its
/// label, or where the frames do not differ (the same code in two
/// processes).
pub fn distinguishing_frames(entries: &[(&str, &[Frame])]) -> Vec<Option<String>> {
    let mut by_label: HashMap<&str, Vec<usize>> = HashMap::new();
    for (index, (label, _)) in entries.iter().enumerate() {
        by_label.entry(label).or_default().push(index);
    }
    // Each stack's named frames from the outermost in.
    let paths: Vec<Vec<String>> = entries
        .iter()
        .map(|(_, frames)| {
            frames
                .iter()
                .rev()
                .filter(|frame| frame.function.is_some())
                .map(frame_label)
                .collect()
        })
        .collect();
    let mut through = vec![None; entries.len()];
    for same in by_label.values_mut().filter(|same| same.len() > 1) {
        // Where each leaves the entry it shares the most with: in path
        // order, that is a neighbour (the longest common start with any
        // path is with the one sorted next to it), so a label shared by
        // many stacks costs a sort, not every pair.
        same.sort_by(|&a, &b| paths[a].cmp(&paths[b]));
        for (at, &entry) in same.iter().enumerate() {
            let path = &paths[entry];
            let before = at
                .checked_sub(1)
                .map_or(0, |previous| first_difference(path, &paths[same[previous]]));
            let after = same
                .get(at + 1)
                .map_or(0, |&next| first_difference(path, &paths[next]));
            through[entry] = path.get(before.max(after)).cloned();
        }
    }
    through
}

/// The first index at which the paths differ (the shorter one's length
/// when one continues the other).
fn first_difference(path: &[String], other: &[String]) -> usize {
    path.iter()
        .zip(other)
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| path.len().min(other.len()))
}

/// `label through frame`: a label grown by its distinguishing frame.
pub fn grown(label: &str, through: &str) -> String {
    format!("{label} through {through}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::python_frame;

    /// The frames of one layer's weights in S1: torch's allocation, the
    /// layer's `__init__` at `line`, the model's, the program's line.
    fn layer(line: u32) -> Vec<Frame> {
        vec![
            python_frame("_ConvNd.__init__", "conv.py", 141),
            python_frame("ResNetBottleNeckLayer.__init__", "modeling_resnet.py", line),
            python_frame("ResNetStage.__init__", "modeling_resnet.py", 200),
            python_frame("run_reproducer", "s1_repro.py", 12),
            python_frame("<module>", "s1_repro.py", 30),
        ]
    }

    #[test]
    fn entries_that_read_the_same_grow_by_where_their_paths_part() {
        let site = "run_reproducer (s1_repro.py:12) via ResNetForImageClassification.__init__";
        let (first, second, other) = (layer(164), layer(167), layer(164));
        let entries = [
            (site, first.as_slice()),
            (site, second.as_slice()),
            ("elsewhere (x.py:1)", other.as_slice()),
        ];
        assert_eq!(
            distinguishing_frames(&entries),
            [
                Some("ResNetBottleNeckLayer.__init__ (modeling_resnet.py:164)".to_owned()),
                Some("ResNetBottleNeckLayer.__init__ (modeling_resnet.py:167)".to_owned()),
                None
            ]
        );
    }

    #[test]
    fn three_alike_grow_by_where_each_leaves_its_nearest() {
        let mut deeper = layer(164);
        deeper.insert(0, python_frame("Parameter.__new__", "parameter.py", 40));
        let mut other_stage = layer(164);
        other_stage[2] = python_frame("ResNetStage.__init__", "modeling_resnet.py", 210);
        let entries = [
            ("site", layer(164)),
            ("site", deeper),
            ("site", other_stage),
        ];
        let entries: Vec<(&str, &[Frame])> = entries
            .iter()
            .map(|(label, frames)| (*label, frames.as_slice()))
            .collect();
        let through = distinguishing_frames(&entries);
        assert_eq!(
            through[1].as_deref(),
            Some("Parameter.__new__ (parameter.py:40)")
        );
        assert_eq!(
            through[2].as_deref(),
            Some("ResNetStage.__init__ (modeling_resnet.py:210)")
        );
        // The first continues into neither: it ends where the second
        // goes on, and is told apart by what it lacks.
        assert_eq!(through[0], None);
    }

    #[test]
    fn the_same_frames_in_two_processes_do_not_grow() {
        let frames = layer(164);
        let entries = [("site", frames.as_slice()), ("site", frames.as_slice())];
        assert_eq!(distinguishing_frames(&entries), [None, None]);
    }
}
