//! The command line: the options with their defaults and checks, and the modes to run.

use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "\
usage: cargo run --release --example webhook -- [options]

  --mode direct|batched|compare  which way to deliver; compare runs both  [compare]
  --compare                      same as --mode compare
  --seconds S                    how long the producers run              [10]
  --rate R                       events per second, all producers        [20000]
  --customers N                  customers (HTTP endpoints)              [1000]
  --producers P                  producer tasks                          [4]
  --window D                     batched: longest wait for a customer    [1s]
  --max-batch N                  batched: Builder::max_batch             [off]
  --capacity N                   batched: Builder::capacity              [off]
  --consumers N                  batched: consumer tasks                 [4]
  --in-flight N                  most requests in flight at once         [64]
  --fail-rate F                  share of requests answered with 503     [0]
  --backoff D                    first retry delay; doubles, up to 2 s   [100ms]
  --seed N                       seed for customers and failures         [1]
  --json PATH                    also write the figures as JSON
  -h, --help                     print this

Durations take a unit: 1s, 500ms, 2.5s.";

/// The command line.
#[derive(Clone, Debug)]
pub struct Options {
    pub mode: ModeChoice,
    pub seconds: Duration,
    pub rate: f64,
    pub customers: u32,
    pub producers: u32,
    pub window: Duration,
    pub max_batch: Option<usize>,
    pub capacity: Option<usize>,
    pub consumers: usize,
    pub in_flight: usize,
    pub fail_rate: f64,
    pub backoff: Duration,
    pub seed: u64,
    pub json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeChoice {
    Direct,
    Batched,
    Compare,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Direct,
    Batched,
}

impl ModeChoice {
    pub fn modes(self) -> &'static [Mode] {
        match self {
            ModeChoice::Direct => &[Mode::Direct],
            ModeChoice::Batched => &[Mode::Batched],
            ModeChoice::Compare => &[Mode::Direct, Mode::Batched],
        }
    }
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Batched => "batched",
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: ModeChoice::Compare,
            seconds: Duration::from_secs(10),
            rate: 20_000.0,
            customers: 1_000,
            producers: 4,
            window: Duration::from_secs(1),
            max_batch: None,
            capacity: None,
            consumers: 4,
            in_flight: 64,
            fail_rate: 0.0,
            backoff: Duration::from_millis(100),
            seed: 1,
            json: None,
        }
    }
}

impl Options {
    /// Parses the arguments after the program name; `Ok(None)` asks for the usage text.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
        let mut options = Options::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            // Both `--name value` and `--name=value`.
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name.to_string(), Some(value.to_string())),
                None => (arg, None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match name.as_str() {
                "-h" | "--help" => return Ok(None),
                "--compare" => options.mode = ModeChoice::Compare,
                "--mode" => {
                    options.mode = match value()?.as_str() {
                        "direct" => ModeChoice::Direct,
                        "batched" => ModeChoice::Batched,
                        "compare" => ModeChoice::Compare,
                        other => return Err(format!("unknown mode {other:?}")),
                    }
                }
                "--seconds" => {
                    let seconds: f64 = number(&name, &value()?)?;
                    options.seconds = Duration::try_from_secs_f64(seconds)
                        .map_err(|_| format!("--seconds: {seconds} is not a duration"))?;
                }
                "--rate" => options.rate = number(&name, &value()?)?,
                "--customers" => options.customers = number(&name, &value()?)?,
                "--producers" => options.producers = number(&name, &value()?)?,
                "--window" => options.window = duration(&name, &value()?)?,
                "--max-batch" => options.max_batch = Some(number(&name, &value()?)?),
                "--capacity" => options.capacity = Some(number(&name, &value()?)?),
                "--consumers" => options.consumers = number(&name, &value()?)?,
                "--in-flight" => options.in_flight = number(&name, &value()?)?,
                "--fail-rate" => options.fail_rate = number(&name, &value()?)?,
                "--backoff" => options.backoff = duration(&name, &value()?)?,
                "--seed" => options.seed = number(&name, &value()?)?,
                "--json" => options.json = Some(PathBuf::from(value()?)),
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        options.check()?;
        Ok(Some(options))
    }

    fn check(&self) -> Result<(), String> {
        let positive = [
            ("--customers", self.customers as usize),
            ("--producers", self.producers as usize),
            ("--consumers", self.consumers),
            ("--in-flight", self.in_flight),
            ("--max-batch", self.max_batch.unwrap_or(1)),
            ("--capacity", self.capacity.unwrap_or(1)),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, n)| *n == 0) {
            return Err(format!("{name} must be at least 1"));
        }
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            return Err("--rate must be a positive number".into());
        }
        // A rate of 1 would fail every retry too, and the program would never finish.
        if !(0.0..1.0).contains(&self.fail_rate) {
            return Err("--fail-rate must be at least 0 and below 1".into());
        }
        Ok(())
    }
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{name}: {value:?} is not a valid number"))
}

fn duration(name: &str, value: &str) -> Result<Duration, String> {
    let (digits, unit) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(s) = value.strip_suffix('s') {
        (s, 1.0)
    } else {
        return Err(format!("{name}: {value:?} needs a unit (ms or s)"));
    };
    let seconds: f64 = number(name, digits)?;
    Duration::try_from_secs_f64(seconds * unit)
        .map_err(|_| format!("{name}: {value:?} is not a duration"))
}
