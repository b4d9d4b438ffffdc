//! Distributed groups: a group of one without a launcher, and two ring
//! ranks on this machine (this test binary started twice with the
//! environment `mlx.launch` gives, a hostfile of two local ports) gathering
//! bytes of different lengths and summing arrays.

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use mlx_core::distributed::Group;
use mlx_core::{Array, Device};

/// The bytes rank `rank` contributes: a length and values of its own.
fn rank_bytes(rank: usize) -> Vec<u8> {
    (0..(3 + 5 * rank)).map(|i| (i * 7 + rank) as u8).collect()
}

#[test]
fn a_process_alone_is_a_group_of_one_that_gathers_and_sums_its_own() {
    if std::env::var_os("MLX_RANK").is_some() {
        return;
    }
    let group = Group::init(false, "any").unwrap();
    assert_eq!((group.rank().unwrap(), group.size().unwrap()), (0, 1));
    assert_eq!(
        group.all_gather_bytes(&[1, 2, 3]).unwrap(),
        vec![vec![1, 2, 3]]
    );
    assert_eq!(group.all_gather_bytes(&[]).unwrap(), vec![Vec::<u8>::new()]);
    let x = Array::from_slice(&[1.5f32, -2.0], &[2]).unwrap();
    let sum = group.all_sum(&x, Device::Cpu).unwrap();
    assert_eq!(sum.to_vec::<f32>().unwrap(), vec![1.5, -2.0]);
    let e = Group::init(true, "ring")
        .err()
        .expect("no hostfile: strict init fails");
    assert!(!e.to_string().is_empty());
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait(mut child: Child, deadline: Instant) -> std::process::ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("a rank did not finish within its time");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_ring_ranks_gather_uneven_bytes_in_rank_order_and_sum() {
    const NAME: &str = "two_ring_ranks_gather_uneven_bytes_in_rank_order_and_sum";
    if let Some(rank) = std::env::var_os("MLX_RANK") {
        // One rank of the pair the test below starts.
        let rank: usize = rank.to_str().unwrap().parse().unwrap();
        let group = Group::init(true, "ring").unwrap();
        assert_eq!((group.rank().unwrap(), group.size().unwrap()), (rank, 2));
        let all = group.all_gather_bytes(&rank_bytes(rank)).unwrap();
        assert_eq!(all, vec![rank_bytes(0), rank_bytes(1)]);
        let x = Array::from_slice(&[rank as f64 + 0.25, 1e-300], &[2]).unwrap();
        let sum = group.all_sum(&x, Device::Cpu).unwrap();
        assert_eq!(sum.to_vec::<f64>().unwrap(), vec![1.5, 2e-300]);
        return;
    }
    let dir = std::env::temp_dir().join(format!("mlx-core-ring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hostfile = dir.join("hosts.json");
    let hosts = format!(
        "[[\"127.0.0.1:{}\"], [\"127.0.0.1:{}\"]]",
        free_port(),
        free_port()
    );
    std::fs::write(&hostfile, hosts).unwrap();
    let me = std::env::current_exe().unwrap();
    let children: Vec<Child> = (0..2)
        .map(|rank| {
            Command::new(&me)
                .args(["--exact", NAME, "--test-threads=1"])
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile)
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for (rank, child) in children.into_iter().enumerate() {
        let status = wait(child, deadline);
        assert!(status.success(), "rank {rank}: {status}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
