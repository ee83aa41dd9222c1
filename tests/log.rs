//! An agent's JSON log as a test reads it: its stderr followed on a thread of its own, each line
//! parsed (a line that is not JSON is kept as a string), and every line received kept in
//! [`LogLines::seen`] so that a wait never loses what arrived before it.

use std::{
    io::{BufRead, BufReader, Read},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

pub struct LogLines {
    lines: mpsc::Receiver<Value>,
    /// Every line received so far.
    pub seen: Vec<Value>,
}

impl LogLines {
    /// Follows `stderr` (an agent's, started with `--log-format json`) until it closes.
    pub fn follow(stderr: impl Read + Send + 'static) -> LogLines {
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        LogLines {
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits until a line with `message` satisfies `pred` (one seen before counts); panics with
    /// the log after `within`.
    pub fn wait_for(
        &mut self,
        message: &str,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        if let Some(found) = self
            .seen
            .iter()
            .find(|v| v["message"] == message && pred(v))
        {
            return found.clone();
        }
        let deadline = Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line["message"] == message && pred(&line) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "no log line {message:?} within {within:?}; the agent logged:\n{:#?}",
            self.seen
        );
    }

    /// Takes in the lines that arrive within `within` (or until the log closes).
    pub fn drain(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => return,
            }
        }
    }

    /// Takes in what has arrived, without waiting.
    pub fn take_in(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }
}

/// The messages of the warnings among `log`'s lines.
pub fn warnings_in(log: &[Value]) -> Vec<&str> {
    log.iter()
        .filter(|l| l["level"] == "WARN")
        .filter_map(|l| l["message"].as_str())
        .collect()
}
