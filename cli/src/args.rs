//! A small argument parser: positionals, `--name value` / `--name=value`
//! options (repeatable), and flags. Every mistake is one line naming the
//! option and pointing at `--help`.

/// Parsed arguments of one subcommand.
#[derive(Debug, Default)]
pub struct Args {
    pub positional: Vec<String>,
    pub options: Vec<(String, String)>,
    pub flags: Vec<String>,
}

impl Args {
    /// Parses `args` for subcommand `cmd`, which takes the options
    /// `with_value` and the flags `flags`.
    pub fn parse(
        cmd: &str,
        args: &[String],
        with_value: &[&str],
        flags: &[&str],
    ) -> Result<Args, String> {
        let mut out = Args::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some(opt) = a.strip_prefix("--") {
                let (name, inline) = match opt.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (opt, None),
                };
                if with_value.contains(&name) {
                    let v = match inline {
                        Some(v) => v,
                        None => it.next().cloned().ok_or_else(|| {
                            format!("--{name} needs a value; see `tessera {cmd} --help`")
                        })?,
                    };
                    out.options.push((name.to_string(), v));
                } else if flags.contains(&name) && inline.is_none() {
                    out.flags.push(name.to_string());
                } else {
                    return Err(format!("unknown option `{a}`; see `tessera {cmd} --help`"));
                }
            } else {
                out.positional.push(a.clone());
            }
        }
        Ok(out)
    }

    /// Every value of option `name`.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.options
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The one value of option `name`, if given (twice is an error).
    pub fn one(&self, name: &str) -> Result<Option<&str>, String> {
        match self.all(name).as_slice() {
            [] => Ok(None),
            [v] => Ok(Some(v)),
            _ => Err(format!("--{name} is given more than once")),
        }
    }

    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    /// `KEY=VALUE` pairs of option `name`.
    pub fn pairs(&self, name: &str) -> Result<Vec<(String, String)>, String> {
        self.all(name)
            .into_iter()
            .map(|kv| {
                kv.split_once('=')
                    .filter(|(k, _)| !k.is_empty())
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .ok_or_else(|| format!("--{name} takes KEY=VALUE, got `{kv}`"))
            })
            .collect()
    }

    /// The single positional (the kernel name).
    pub fn kernel(&self, cmd: &str) -> Result<&str, String> {
        match self.positional.as_slice() {
            [k] => Ok(k),
            [] => Err(format!(
                "name a kernel; `tessera list` shows them (`tessera {cmd} --help`)"
            )),
            [_, extra, ..] => Err(format!(
                "unexpected argument `{extra}`; see `tessera {cmd} --help`"
            )),
        }
    }
}

/// `16x128` → `[16, 128]`.
pub fn parse_shape(s: &str) -> Result<Vec<usize>, String> {
    let dims: Result<Vec<usize>, _> = s.split('x').map(str::parse::<usize>).collect();
    let d = match dims {
        Ok(d) if !d.is_empty() && d.iter().all(|&x| x > 0) => d,
        _ => {
            return Err(format!(
                "bad shape `{s}`; write dims joined by x, like 16x128"
            ));
        }
    };
    // An array must be addressable: its element count (and bytes, at up to
    // 4 per element) below 2^40 and each dim an i32 index, as the kernels'
    // index arithmetic is.
    let elems = d.iter().try_fold(1u64, |a, &x| a.checked_mul(x as u64));
    match elems {
        Some(n) if n <= MAX_ELEMENTS && d.iter().all(|&x| x <= i32::MAX as usize) => Ok(d),
        _ => Err(format!(
            "shape `{s}` is too large: at most {MAX_ELEMENTS} elements and {} per dim",
            i32::MAX
        )),
    }
}

/// The most elements a `--shape` may have (4 TiB of f32).
pub const MAX_ELEMENTS: u64 = 1 << 40;
