package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is a server the harness started; it is stopped by its PID.
type process struct {
	name string
	cmd  *exec.Cmd
	dir  string
	log  *os.File
	done chan struct{}
	err  error
}

// startProcess runs bin with args, its output in dir/<name>.log, and returns at once. onLine, if not
// nil, sees each line of its stdout until it returns true.
func startProcess(name, dir, bin string, args []string, onLine func(string) bool) (*process, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the harness
	var stdout io.ReadCloser
	if onLine != nil {
		if stdout, err = cmd.StdoutPipe(); err != nil {
			logf.Close()
			return nil, err
		}
	} else {
		cmd.Stdout = logf
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &process{name: name, cmd: cmd, dir: dir, log: logf, done: make(chan struct{})}
	var copyDone sync.WaitGroup
	if stdout != nil {
		copyDone.Add(1)
		go func() {
			defer copyDone.Done()
			sc := bufio.NewScanner(stdout)
			matched := false
			for sc.Scan() {
				line := sc.Text()
				fmt.Fprintln(logf, line)
				if !matched && onLine(line) {
					matched = true
				}
			}
		}()
	}
	go func() {
		copyDone.Wait()
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process ended, with its log's tail as the error.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); log tail:\n%s", p.name, p.err, p.tail())
	default:
		return nil
	}
}

func (p *process) tail() string {
	b, _ := os.ReadFile(p.log.Name())
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// stop sends SIGTERM to the process's PID, waits up to 30 s, then SIGKILL.
func (p *process) stop() {
	if p == nil {
		return
	}
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	p.log.Close()
}

// waitFor polls cond every 50 ms until it returns nil, the process exits, or timeout passes.
func waitFor(p *process, timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if e := p.exited(); e != nil {
			return e
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w; log tail:\n%s", p.name, timeout, err, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// versionOf runs bin with args and returns the first match of re (or the first line) of its output.
func versionOf(bin string, re string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil && len(out) == 0 {
		return "unknown (" + err.Error() + ")"
	}
	s := strings.TrimSpace(string(out))
	if m := regexp.MustCompile(re).FindString(s); m != "" {
		return m
	}
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

var errStopped = errors.New("stopped")
