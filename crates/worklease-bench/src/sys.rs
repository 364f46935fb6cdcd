//! What the machine is and what this process costs: cores, CPU model,
//! memory, kernel, load average (`/proc`), CPU time (`getrusage`) and
//! resident memory (`/proc/self/statm`).

use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};

use crate::results::Machine;
use crate::Result;

/// The machine this run is on, with the load average now.
pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / (1024.0 * 1024.0));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string());
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    Machine {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        memory_gib,
        kernel,
        rustc,
        load_average_start: load_average(),
        load_average_end: None,
    }
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`).
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// CPU time (user + system) this process has used so far.
pub fn cpu_time() -> Result<Duration> {
    let usage = getrusage(UsageWho::RUSAGE_SELF)?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Ok(tv(usage.user_time()) + tv(usage.system_time()))
}

/// This process's resident memory in bytes (`/proc/self/statm`, second
/// field, in pages).
pub fn resident_bytes() -> Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .ok_or("/proc/self/statm has no resident field")?
        .parse()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)?
        .ok_or("the page size is unknown")?;
    Ok(pages * page as u64)
}
