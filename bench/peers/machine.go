package main

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-io/runnel/bench/report"
)

// machineInfo describes this computer, and the disk under dir where the servers keep their data.
func machineInfo(dir string) report.Machine {
	m := report.Machine{CPUs: runtime.NumCPU(), GoVer: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				m.MemoryGB = kb / (1 << 20)
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	m.LoadAvg = loadAvg()
	m.Disk = diskInfo(dir)
	return m
}

func diskInfo(dir string) string {
	out := command("df", "-hT", dir)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 {
		return "unknown"
	}
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 7 {
		return lines[len(lines)-1]
	}
	dev, fs, size, avail := f[0], f[1], f[2], f[4]
	s := dev + " (" + fs + ", " + size + ", " + avail + " free)"
	name := strings.TrimPrefix(dev, "/dev/")
	if b, err := os.ReadFile("/sys/block/" + name + "/queue/rotational"); err == nil {
		if strings.TrimSpace(string(b)) == "1" {
			s += ", rotational"
		} else {
			s += ", non-rotational"
		}
	}
	if b, err := os.ReadFile("/sys/block/" + name + "/device/model"); err == nil && strings.TrimSpace(string(b)) != "" {
		s += ", model " + strings.TrimSpace(string(b))
	} else if strings.HasPrefix(name, "vd") {
		s += ", virtio block device"
	}
	return s
}

func command(name string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, _ := exec.CommandContext(ctx, name, args...).Output()
	return string(b)
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			return strings.Join(f[:3], " ")
		}
	}
	return ""
}
