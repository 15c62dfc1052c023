//! The vCPU threads' start-up order.

use super::*;
use crate::hv::fake::FakeVm;
use std::time::Duration;

const ENTRY: u64 = 0x4020_0000;
const CONTEXT: u64 = 0x4100_0000;

/// Runs `start_up` for each group on its own thread against a [`FakeVm`]
/// whose log the threads add `run <id>` to once they may run. The VM's
/// thread (the test) logs `release` when it lets them go, after every
/// vCPU exists. Returns the log.
fn start_up_order(start: Start, groups: Vec<Vec<VcpuId>>, fail: Option<VcpuId>) -> Vec<String> {
    let cpus = groups.iter().map(Vec::len).sum();
    let vm = Arc::new(FakeVm {
        fail,
        ..FakeVm::default()
    });
    let control = Arc::new(RunState::new(vec![VcpuPower::Off; cpus], &groups));
    let spawn = |ids: Vec<VcpuId>| {
        let (vm, control, start) = (vm.clone(), control.clone(), start.clone());
        std::thread::spawn(move || match start_up(&*vm, &control, &ids, &start) {
            Ok(Some(vcpus)) => {
                for rv in vcpus {
                    vm.log.lock().unwrap().push(format!("run {}", rv.vcpu.id()));
                }
            }
            Ok(None) => {}
            Err(e) => control.finish(VmExit::Error(format!("{e:#}"))),
        })
    };
    let mut groups = groups.into_iter();
    let first = spawn(groups.next().unwrap());
    // The first thread has its vCPUs but not the others: it must not run
    // (a failure here is certain if it would, whatever the timing).
    std::thread::sleep(Duration::from_millis(100));
    assert!(!vm.log.lock().unwrap().iter().any(|e| e.starts_with("run")));
    let mut threads: Vec<_> = groups.map(spawn).collect();
    threads.push(first);
    control.wait_created();
    if !control.finished() {
        vm.log.lock().unwrap().push("release".into());
    }
    control.release(Ok(()));
    for t in threads {
        t.join().unwrap();
    }
    let log = vm.log.lock().unwrap().clone();
    log
}

/// Where `event` is in `log`.
fn at(log: &[String], event: &str) -> usize {
    log.iter()
        .position(|e| e == event)
        .unwrap_or_else(|| panic!("no {event:?} in {log:?}"))
}

#[test]
fn every_vcpu_exists_before_any_runs_on_a_fresh_boot() {
    let boot = Start::Boot(BootRegs {
        entry: ENTRY,
        dtb: CONTEXT,
    });
    for groups in [vec![vec![0], vec![1], vec![2]], vec![vec![0, 1, 2]]] {
        let log = start_up_order(boot.clone(), groups, None);
        let release = at(&log, "release");
        for id in 0..3 {
            assert!(at(&log, &format!("create {id}")) < release, "{log:?}");
            assert!(at(&log, &format!("run {id}")) > release, "{log:?}");
        }
    }
}

#[test]
fn every_vcpu_exists_before_any_runs_on_a_restore() {
    let vm = FakeVm::default();
    let states = (0..3)
        .map(|id| {
            let mut vcpu = vm.create_vcpu(id, mpidr(id)).unwrap();
            state::capture_vcpu(&mut vcpu).unwrap()
        })
        .collect();
    let restore = Start::Restore {
        states: Arc::new(states),
    };
    let log = start_up_order(restore, vec![vec![0], vec![1], vec![2]], None);
    let release = at(&log, "release");
    for id in 0..3 {
        assert!(at(&log, &format!("create {id}")) < release, "{log:?}");
        assert!(at(&log, &format!("run {id}")) > release, "{log:?}");
    }
}

#[test]
fn a_vcpu_that_cannot_be_created_ends_the_start_up() {
    let boot = Start::Boot(BootRegs {
        entry: ENTRY,
        dtb: CONTEXT,
    });
    let log = start_up_order(boot, vec![vec![0], vec![1], vec![2]], Some(1));
    assert!(
        !log.iter().any(|e| e == "release" || e.starts_with("run")),
        "{log:?}"
    );
}
