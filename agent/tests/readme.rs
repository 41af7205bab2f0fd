//! The README's tutorial, run as a new user runs it: every command of its `## Tutorial` section,
//! in order, in one shell, against the workspace's own binaries and real Envoy, each step's
//! output checked against the `text` block the README shows under it. So the README cannot
//! drift from what the binaries do.
//!
//! How the README is read:
//! - a step is a `sh` block, with the `text` block right after it, if any, as its output
//!   (standard output and error together, as a terminal shows them); a step without one must
//!   print nothing;
//! - a line ending in `\` goes on on the next; each command must exit 0, but one whose comment
//!   says `(exit N)`, which must exit N;
//! - in the shown output, a line `…` stands for any number of lines and `…` within a line for
//!   any text; runs of spaces count as one (table columns widen with their values).
//!
//! What differs from a user's shell, and why: `cargo build` is not run (the running `cargo
//! test` built the binaries and holds the build directory); `$PWD/target/debug` is the
//! directory those binaries are in; `/tmp/pasa` is a temporary folder of the test's own; the
//! shell runs in a network namespace the test creates, so the tutorial's fixed ports (7400,
//! 15000, 15021, ...) are free whatever else runs. Every process the tutorial starts is gone
//! when the test ends: its last step stops them, and the namespace's leftovers are killed.
//!
//! Needs `envoy` and root (for the namespace); says loudly when it skipped.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::envoy::{self, Netns};

/// A command taking longer than this is hung (the slowest, waiting for Envoy, retries 30 s).
const COMMAND_LIMIT: Duration = Duration::from_secs(60);
/// What the shell prints after each command: this, then the command's exit status.
const MARK: &str = "@@readme-exit ";

/// One command line of a step.
#[derive(Debug, PartialEq)]
struct Line {
    text: String,
    /// The exit status its comment announces, 0 otherwise.
    exit: i32,
}

/// One `sh` block and the output shown under it.
#[derive(Debug, PartialEq)]
struct Step {
    lines: Vec<Line>,
    shown: Vec<String>,
}

/// The steps of the README's `## Tutorial` section.
fn tutorial(readme: &str) -> Vec<Step> {
    let start = readme
        .find("\n## Tutorial\n")
        .expect("the README has a `## Tutorial` section");
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = section.lines();
    // Whether anything but blank lines came since the last block closed.
    let mut prose_since_block = true;
    while let Some(line) = lines.next() {
        let fence = line.trim_end();
        if let Some(lang) = fence.strip_prefix("```") {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| l.trim_end() != "```")
                .collect();
            match lang {
                "sh" => steps.push(Step {
                    lines: commands(&body),
                    shown: Vec::new(),
                }),
                "text" => {
                    let step = steps
                        .last_mut()
                        .filter(|s| !prose_since_block && s.shown.is_empty())
                        .expect("a `text` block follows the `sh` block whose output it shows");
                    step.shown = body.iter().map(|l| l.to_string()).collect();
                }
                other => panic!("the tutorial has a ```{other} block; it knows sh and text"),
            }
            prose_since_block = false;
        } else if !line.trim().is_empty() {
            prose_since_block = true;
        }
    }
    steps
}

/// The commands of a `sh` block: continued lines joined, comments read for `(exit N)`.
fn commands(body: &[&str]) -> Vec<Line> {
    let mut out = Vec::new();
    let mut current = String::new();
    for raw in body {
        if let Some(head) = raw.strip_suffix('\\') {
            current.push_str(head);
            continue;
        }
        current.push_str(raw);
        let text = std::mem::take(&mut current);
        if text.trim().is_empty() {
            continue;
        }
        let exit = text
            .split_once(" # ")
            .and_then(|(_, comment)| comment.split_once("(exit ")?.1.split_once(')'))
            .map_or(0, |(n, _)| n.parse().expect("(exit N) names a number"));
        out.push(Line { text, exit });
    }
    out
}

/// Whether `actual` is what `shown` shows (see the module's documentation).
fn shows(shown: &[String], actual: &[String]) -> bool {
    fn squeeze(line: &str) -> String {
        line.split_whitespace().collect::<Vec<_>>().join(" ")
    }
    fn line_matches(pattern: &str, line: &str) -> bool {
        let parts: Vec<&str> = pattern.split('…').collect();
        let Some((first, rest)) = parts.split_first() else {
            return true;
        };
        let Some(mut left) = line.strip_prefix(first) else {
            return false;
        };
        for (i, part) in rest.iter().enumerate() {
            if i == rest.len() - 1 {
                return left.ends_with(part);
            }
            match left.find(part) {
                Some(at) => left = &left[at + part.len()..],
                None => return false,
            }
        }
        left.is_empty()
    }
    fn from(shown: &[String], actual: &[String]) -> bool {
        match shown.split_first() {
            None => actual.is_empty(),
            Some((any, rest)) if any == "…" => {
                (0..=actual.len()).any(|skip| from(rest, &actual[skip..]))
            }
            Some((pattern, rest)) => actual
                .split_first()
                .is_some_and(|(line, more)| line_matches(pattern, line) && from(rest, more)),
        }
    }
    let shown: Vec<String> = shown
        .iter()
        .map(|l| squeeze(l))
        .filter(|l| !l.is_empty())
        .collect();
    let actual: Vec<String> = actual
        .iter()
        .map(|l| squeeze(l))
        .filter(|l| !l.is_empty())
        .collect();
    from(&shown, &actual)
}

/// The shell the tutorial runs in, and what it prints, line by line.
struct Shell {
    child: std::process::Child,
    lines: Receiver<String>,
}

impl Shell {
    fn start(netns: &Netns, dir: &Path, path: &str) -> Shell {
        let mut command = netns.command("bash");
        command
            .args(["--noprofile", "--norc"])
            .current_dir(pasa_testing::workspace_root())
            .env("PATH", path)
            .env("HOME", dir)
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("PASA_") {
                command.env_remove(key);
            }
        }
        let mut child = command.spawn().expect("start bash in the namespace");
        let stdout = child.stdout.take().expect("piped");
        let mut shell = Shell {
            lines: pasa_testing::line_channel(std::io::BufReader::new(stdout)),
            child,
        };
        assert_eq!(shell.run("exec 2>&1"), (vec![], 0));
        shell
    }

    fn send(&mut self, text: &str) {
        let stdin = self.child.stdin.as_mut().expect("piped");
        writeln!(stdin, "{text}\nprintf '{MARK}%s\\n' \"$?\"").expect("write to the shell");
    }

    /// Runs `line`: what it printed and its exit status.
    fn run(&mut self, line: &str) -> (Vec<String>, i32) {
        self.send(line);
        let deadline = Instant::now() + COMMAND_LIMIT;
        let mut printed = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(text) = self.lines.recv_timeout(left) else {
                panic!(
                    "`{line}` did not finish within {COMMAND_LIMIT:?}; it printed:\n{}",
                    printed.join("\n")
                );
            };
            if let Some((before, status)) = text.split_once(MARK) {
                if !before.is_empty() {
                    printed.push(before.to_string());
                }
                return (printed, status.trim().parse().expect("an exit status"));
            }
            printed.push(text);
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The directory holding `envoy` for the tutorial's `envoy` command: PATH's own, or one with a
/// link to `PASA_TEST_ENVOY`.
fn envoy_dir(dir: &Path) -> PathBuf {
    let binary = envoy::envoy_binary().expect("envoy");
    if binary.file_name().is_some_and(|n| n == "envoy") {
        return binary.parent().expect("a directory").to_path_buf();
    }
    let linked = dir.join("envoy-bin");
    std::fs::create_dir_all(&linked).expect("mkdir");
    std::os::unix::fs::symlink(&binary, linked.join("envoy")).expect("link envoy");
    linked
}

#[test]
fn the_tutorial_does_what_the_readme_says() {
    if envoy::skip_without_envoy("the_tutorial_does_what_the_readme_says") {
        return;
    }
    let root = pasa_testing::workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let steps = tutorial(&readme);
    assert!(steps.len() >= 7, "the tutorial has {} steps", steps.len());
    let bin = pasa_testing::workspace_binary("pasa-pcp", "pasa-pcp");
    let bin = bin.parent().expect("target/debug");
    for (name, package) in [("pasactl", "pasactl"), ("pasa-agent", "pasa-agent")] {
        pasa_testing::workspace_binary(name, package);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join("pasa");
    let path = std::env::join_paths(
        [bin.to_path_buf(), envoy_dir(dir.path())]
            .into_iter()
            .chain(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            )),
    )
    .expect("PATH");
    let netns = Netns::create();
    let mut shell = Shell::start(&netns, dir.path(), &path.to_string_lossy());
    let mut commands = 0;
    for (n, step) in steps.iter().enumerate() {
        let mut printed = Vec::new();
        for line in &step.lines {
            if line.text.trim_start().starts_with("cargo build") {
                println!(
                    "step {}: `{}` not run: the test's own build made the binaries",
                    n + 1,
                    line.text
                );
                continue;
            }
            let text = line
                .text
                .replace("$PWD/target/debug", &bin.to_string_lossy())
                .replace("/tmp/pasa", &tmp.to_string_lossy());
            let (out, status) = shell.run(&text);
            assert_eq!(
                status,
                line.exit,
                "step {}: `{}` exited {status}, the README says {}; it printed:\n{}",
                n + 1,
                line.text,
                line.exit,
                out.join("\n")
            );
            printed.extend(out);
            commands += 1;
        }
        let actual: Vec<String> = printed
            .iter()
            .map(|l| l.replace(&*tmp.to_string_lossy(), "/tmp/pasa"))
            .collect();
        assert!(
            shows(&step.shown, &actual),
            "step {}: the README shows\n{}\n\nbut it printed\n{}",
            n + 1,
            step.shown.join("\n"),
            actual.join("\n")
        );
        println!(
            "step {}: {} commands, output as the README shows",
            n + 1,
            step.lines.len()
        );
    }
    drop(shell);
    let left = netns.pids();
    for pid in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        left.is_empty(),
        "the tutorial's last step leaves processes running: {left:?}"
    );
    println!(
        "README tutorial: {} steps, {commands} commands run",
        steps.len()
    );
}

#[test]
fn the_readme_is_read_as_the_test_says() {
    let readme = "intro\n## Tutorial\nText.\n```sh\nfoo --a \\\n  --b\nbar   # (exit 1) bad\n```\n```text\nout\n```\nMore.\n```sh\nbaz &\n```\n## Next\n```sh\nnot me\n```\n";
    let steps = tutorial(readme);
    assert_eq!(
        steps,
        vec![
            Step {
                lines: vec![
                    Line {
                        text: "foo --a   --b".into(),
                        exit: 0
                    },
                    Line {
                        text: "bar   # (exit 1) bad".into(),
                        exit: 1
                    },
                ],
                shown: vec!["out".into()],
            },
            Step {
                lines: vec![Line {
                    text: "baz &".into(),
                    exit: 0
                }],
                shown: vec![],
            },
        ]
    );
    let s = |v: &[&str]| v.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    assert!(shows(
        &s(&["A  B", "…", "end …"]),
        &s(&["A B", "x", "y", "end 12"])
    ));
    assert!(shows(&s(&["A …"]), &s(&["A 1"])));
    assert!(!shows(&s(&["A …"]), &s(&["A 1", "extra"])));
    assert!(!shows(&s(&["REVISION 9"]), &s(&["REVISION 10"])));
    assert!(shows(&s(&["a…c…e"]), &s(&["abcde"])));
    assert!(!shows(&s(&[]), &s(&["unexpected"])));
}
