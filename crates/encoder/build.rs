//! Tells the tests which of the encoder's kernels this machine can run, so that a kernel the CPU
//! lacks is reported as ignored (not run), never as passed: `cpu_amx` (AMX tiles with bf16),
//! `cpu_vnni` (AVX-512 VNNI and the subsets the wide kernel uses), `cpu_avx512` (the AVX-512
//! subsets the elementwise loops are compiled for), `cpu_avx2` (AVX2 with FMA).
//! The crate's code decides at run time as before; these flags only mark tests. Cargo runs this
//! again when `/proc/cpuinfo` changes time, which it does when a machine boots, so a target
//! directory carried to another machine is told that machine's CPU.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=/proc/cpuinfo");
    for flag in ["cpu_amx", "cpu_vnni", "cpu_avx512", "cpu_avx2"] {
        println!("cargo::rustc-check-cfg=cfg({flag})");
    }
    #[cfg(target_arch = "x86_64")]
    {
        let has = |feature: &str| match feature {
            "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
            "avx512dq" => std::arch::is_x86_feature_detected!("avx512dq"),
            "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
            "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
            "avx2" => std::arch::is_x86_feature_detected!("avx2"),
            "fma" => std::arch::is_x86_feature_detected!("fma"),
            _ => false,
        };
        if ["avx512f", "avx512bw", "avx512dq", "avx512vnni"]
            .iter()
            .all(|feature| has(feature))
        {
            println!("cargo::rustc-cfg=cpu_vnni");
            println!("cargo::metadata=vnni=1");
        }
        if ["avx512f", "avx512bw", "avx512dq", "avx512vl", "fma"]
            .iter()
            .all(|feature| has(feature))
        {
            println!("cargo::rustc-cfg=cpu_avx512");
            println!("cargo::metadata=avx512=1");
        }
        if has("avx2") && has("fma") {
            println!("cargo::rustc-cfg=cpu_avx2");
            println!("cargo::metadata=avx2=1");
        }
        // CPUID leaf 7, EDX bit 22 (AMX-BF16) and bit 24 (AMX-TILE), as `amx::supported` reads
        // them; whether Linux grants the tile state is checked by the tests themselves.
        // SAFETY: `cpuid` exists on every x86_64 CPU and only reads identification registers.
        #[allow(unused_unsafe)]
        let (highest, leaf7) = unsafe {
            (
                std::arch::x86_64::__cpuid_count(0, 0).eax,
                std::arch::x86_64::__cpuid_count(7, 0),
            )
        };
        if highest >= 7 && leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0 {
            println!("cargo::rustc-cfg=cpu_amx");
            println!("cargo::metadata=amx=1");
        }
    }
}
