package apiserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EtcdBinaryEnv names the environment variable that, when set, is the path
// of the etcd binary to run; otherwise "etcd" is looked up in $PATH, and
// failing that [EtcdBinary] builds one with the go command.
const EtcdBinaryEnv = "ETCD_BIN"

// etcdStartTimeout bounds how long etcd may take to answer /health.
const etcdStartTimeout = 30 * time.Second

// etcdStopTimeout bounds how long etcd may take to exit after SIGTERM before
// it is killed.
const etcdStopTimeout = 10 * time.Second

// Etcd is an etcd server running as a child process of the test binary, on
// free loopback ports, with a data directory of its own.
type Etcd struct {
	// URL is the client URL, http://127.0.0.1:PORT.
	URL string
	// DataDir is the data directory, removed when the test ends.
	DataDir string
	// Version is what `etcd --version` printed first, such as
	// "etcd Version: 3.4.23".
	Version string

	proc *child
}

// EtcdBinary returns the path of the etcd binary: $ETCD_BIN when set, else
// "etcd" found in $PATH, else etcd built from this package's test data,
// the module testdata/etcd (see [pinnedBuild.build]): built once per machine into
// the user's cache directory, so that the tests need nothing but Go.
// The error tells how to provide one.
func EtcdBinary(t testing.TB) (string, error) {
	t.Helper()
	if p := os.Getenv(EtcdBinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s=%q: %w", EtcdBinaryEnv, p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	p, err := etcdBuild.binary(t)
	if err != nil {
		return "", fmt.Errorf("no etcd binary: $%s is unset, there is no etcd in $PATH, "+
			"and building one with Go failed (set $%s or put etcd in $PATH instead; "+
			"on Debian: apt-get install etcd-server, which installs /usr/bin/etcd): %w",
			EtcdBinaryEnv, EtcdBinaryEnv, err)
	}
	return p, nil
}

// StartEtcd starts etcd for the test and stops it, removing its data, when
// the test ends. It fails the test if no etcd binary is found or can be
// built (see [EtcdBinary]) or etcd does not become healthy within 30
// seconds.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	bin, err := EtcdBinary(t)
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	version := etcdVersion(bin)
	// etcd warns unless its data directory is private.
	dataDir := filepath.Join(t.TempDir(), "etcd")
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		t.Fatalf("etcd: %v", err)
	}

	// The ports are free when picked but are closed again before etcd binds
	// them, so another process may take one in between: retry a few times
	// when etcd exits at start.
	const attempts = 5
	for i := 1; ; i++ {
		e, err := startEtcdOnce(t, bin, dataDir)
		if err == nil {
			e.Version = version
			return e
		}
		if i == attempts {
			t.Fatalf("etcd: %v", err)
		}
		t.Logf("etcd: attempt %d: %v; retrying on other ports", i, err)
		if err := os.RemoveAll(dataDir); err != nil {
			t.Fatalf("etcd: %v", err)
		}
		if err := os.Mkdir(dataDir, 0o700); err != nil {
			t.Fatalf("etcd: %v", err)
		}
	}
}

func startEtcdOnce(t testing.TB, bin, dataDir string) (*Etcd, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	e := &Etcd{URL: clientURL, DataDir: dataDir}
	e.proc, err = startChild(bin,
		"--name=dispatch-test",
		"--data-dir="+dataDir,
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=dispatch-test="+peerURL,
		"--initial-cluster-state=new",
		"--logger=zap",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}

	if err := e.waitHealthy(etcdStartTimeout); err != nil {
		e.proc.stop(etcdStopTimeout)
		return nil, fmt.Errorf("%w\netcd output:\n%s", err, e.Output())
	}
	t.Cleanup(func() {
		e.proc.stop(etcdStopTimeout)
		if t.Failed() {
			t.Logf("etcd output:\n%s", e.Output())
		}
	})
	return e, nil
}

// waitHealthy polls /health until etcd reports healthy, etcd exits or the
// timeout passes.
func (e *Etcd) waitHealthy(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"health":"true"`)) {
				return nil
			}
			err = fmt.Errorf("/health: %s: %s", resp.Status, bytes.TrimSpace(body))
		}
		last = err
		select {
		case <-e.proc.done:
			return fmt.Errorf("etcd exited at start: %v", e.proc.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("etcd not healthy after %v: %v", timeout, last)
		case <-tick.C:
		}
	}
}

// Output returns what etcd has printed so far.
func (e *Etcd) Output() string { return e.proc.output.String() }

// etcdVersion returns the first line `etcd --version` prints, or the error.
func etcdVersion(bin string) string {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return first
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
