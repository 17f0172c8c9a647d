// Package e2e builds kube-scheduler and runs upstream's tests with the
// drop-in, in a copy of k8s.io/kubernetes materialised by this module: the
// api_dispatcher package's exported-API test (against the drop-in and, as
// the baseline, upstream's own package), upstream's integration test of
// binding, and the kube-scheduler binary binding a pod on a real
// kube-apiserver. Each test runs the go command in the copy, outside the
// workspace; the copy lives in the user's cache directory and is made once.
//
// The tests run only when asked, with -e2e:
//
//	go test -race -count=1 -timeout 45m ./dropin/e2e -e2e
//
// The first run compiles what kube-scheduler and kube-apiserver need from
// the copy (the build cache keys on directories, so nothing compiled from
// the module cache is reused): tens of CPU-minutes, which TestMain spends
// before the tests start, but which go test's own watchdog counts (it
// kills a test binary that runs longer than -timeout plus a minute, 11
// minutes by default, 31 under the README's test command). On two cores
// that does not fit reliably beside the other modules' tests, so the
// README's test command leaves these tests out. TestMain builds only what
// the tests -run selects: .ci/run runs TestMaterialise and
// TestAPIDispatcherPackage in a step of their own, which builds no
// kube-apiserver; the whole package, cold, took 25m50s on two cores, too
// much of CI's budget (kube/scheduler/README.md, "Tests").
package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coalescer/dispatch/dropin"
	"github.com/coalescer/dispatch/dropin/internal/gotest"
	"github.com/coalescer/dispatch/test/integration/apiserver"
	"github.com/coalescer/dispatch/test/integration/testrun"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TestMain makes the copy and builds in it everything the tests run —
// upstream's test binaries, kube-scheduler — before m.Run, so that the
// compilation (tens of CPU-minutes the first time: kube-apiserver and
// kube-scheduler from the copy) is a build step, as go test's own is, not
// test time under -timeout; the tests then find it all in the build cache.
// Without -e2e, or under -short, the tests skip, and nothing is built.
//
// Then it checks for leaked goroutines (leaked): see test/integration's
// TestMain for the one goroutine kube-apiserver leaves behind.
func TestMain(m *testing.M) {
	flag.Parse()
	if *e2e && !testing.Short() {
		if err := prepare(context.Background()); err != nil {
			os.RemoveAll(prepared.tmp)
			fmt.Fprintln(os.Stderr, "e2e:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if code == 0 {
		if err := leaked(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.RemoveAll(prepared.tmp)
	os.Exit(code)
}

// leaked reports the goroutines left once the tests are over, but the
// klog health check kube-apiserver never stops (see test/integration's
// TestMain). It gives the others freshWait to end: kube-apiserver's watch
// cache starts a goroutine for each read it must serve fresh (a consistent
// list, as kube-scheduler's informers make), which sleeps out the cache's
// 3-second block timeout even when the read is served at once — a
// goroutine that ends by itself, not a leak; one still there after that
// is.
func leaked() error {
	const freshWait = 5 * time.Second
	deadline := time.Now().Add(freshWait)
	for {
		err := goleak.Find(goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.Forever"))
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond) // goleak.Find has waited a little too
	}
}

// prepared is what prepare made, and how long each step took.
var prepared struct {
	tree      *upstream.Tree
	tmp       string // removed when the tests end
	scheduler string // the kube-scheduler binary, in tmp
	steps     []string
}

// The packages whose tests run, and how (upstreamFlags).
const (
	dispatcherPkg = "./pkg/scheduler/backend/api_dispatcher"
	bindPkg       = "./test/integration/scheduler/bind"
)

func prepare(ctx context.Context) error {
	step := func(what string, f func() error) error {
		start := time.Now()
		err := f()
		prepared.steps = append(prepared.steps, fmt.Sprintf("%s: %v", what, time.Since(start).Round(time.Second)))
		return err
	}
	if err := step("materialise", func() (err error) {
		prepared.tree, err = upstream.Materialise(ctx, upstream.Options{Local: upstream.LocalCheckout()})
		return err
	}); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "dispatch-e2e-")
	if err != nil {
		return err
	}
	prepared.tmp = tmp
	// The binaries built here are only to fill the build cache, but
	// kube-scheduler's, which the tests run.
	if err := os.Mkdir(filepath.Join(tmp, "throwaway"), 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Join(tmp, "throwaway"))
	prepared.scheduler = filepath.Join(tmp, "kube-scheduler")
	build := func(args ...string) error {
		cmd := exec.CommandContext(ctx, gotest.GoCommand(), args...)
		cmd.Dir, cmd.Env = prepared.tree.Dir, append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	throwaway := func(name string) string { return filepath.Join(tmp, "throwaway", name) }
	// Each build only for the tests go test will run (-run, -skip), so
	// that CI can run the api_dispatcher test without paying for
	// kube-apiserver's and kube-scheduler's builds.
	for _, b := range []struct {
		test string
		what string
		args []string
	}{
		{"TestAPIDispatcherPackage", "build the api_dispatcher test (drop-in)", append(append([]string{"test", "-c", "-o", throwaway("ours.test")}, upstreamBuildFlags(unit)...), dispatcherPkg)},
		{"TestAPIDispatcherPackage", "build the api_dispatcher test (upstream's)", append(append([]string{"test", "-c", "-o", throwaway("theirs.test"), "-tags", upstream.BaselineTag}, upstreamBuildFlags(unit)...), dispatcherPkg)},
		{"TestIntegrationBind", "build upstream's binding integration test", append(append([]string{"test", "-c", "-o", throwaway("bind.test")}, upstreamBuildFlags(integration)...), bindPkg)},
	} {
		if !testrun.Selected(b.test) {
			continue
		}
		if err := step(b.what, func() error { return build(b.args...) }); err != nil {
			return err
		}
	}
	if !testrun.Selected("TestKubeSchedulerBinary") {
		return nil
	}
	// kube-scheduler, with the README's one command: go run of
	// cmd/materialise -build, from this module (in the workspace).
	return step("build kube-scheduler (cmd/materialise -build)", func() error {
		cmd := exec.CommandContext(ctx, gotest.GoCommand(), "run", "../cmd/materialise", "-q", "-build", prepared.scheduler)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go run ../cmd/materialise -build: %v\n%s", err, out)
		}
		return nil
	})
}

// e2e asks for the tests (see the package documentation).
var e2e = flag.Bool("e2e", false, "build kube-scheduler and upstream's tests in a copy of k8s.io/kubernetes, and run them (the first run compiles for tens of CPU-minutes: give -timeout room)")

// materialised returns the copy TestMain made, and skips without -e2e or
// under -short.
func materialised(t *testing.T) *upstream.Tree {
	t.Helper()
	switch {
	case !*e2e:
		t.Skip("run with -e2e (and a -timeout with room for the first build): builds kube-scheduler and upstream's tests in a copy of k8s.io/kubernetes")
	case testing.Short():
		t.Skip("-short: builds kube-scheduler and upstream's tests in a copy of k8s.io/kubernetes")
	}
	return prepared.tree
}

// goTest runs go test in the copy, with the flags upstream's CI uses for
// the kind of test (upstreamFlags). If the run fails only because
// upstream's integration framework gave kube-apiserver too little time to
// start (gotest.StartupTimeout), it runs once more, and says so.
func goTest(t *testing.T, kind testKind, args []string, env ...string) gotest.Summary {
	t.Helper()
	flags := append([]string{"-count=1"}, upstreamFlags(kind)...)
	r := gotest.Run{Go: gotest.GoCommand(), Dir: materialised(t).Dir, Args: append(flags, args...), Env: env, Log: testWriter{t}}
	s := r.Do(t.Context())
	t.Logf("go test %s: %v", strings.Join(r.Args, " "), s.Elapsed.Round(time.Second))
	if s.OnlyStartupTimeouts() {
		t.Logf("kube-apiserver did not start within upstream's framework's limit (%s): running again once", gotest.StartupTimeout)
		s = r.Do(t.Context())
		t.Logf("go test %s: %v", strings.Join(r.Args, " "), s.Elapsed.Round(time.Second))
	}
	for _, f := range s.Failed() {
		t.Errorf("failed: %s\n%s", f, s.Output[strings.TrimSuffix(strings.TrimSuffix(f, " (fail)"), " (build failed)")])
	}
	return s
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestMaterialise: the copy is made once and then reused; its default
// build has the drop-in and nothing of upstream's package, and the
// baseline tag upstream's package exactly.
func TestMaterialise(t *testing.T) {
	first := materialised(t)
	t.Logf("%s; TestMain's steps: %s", first.Dir, strings.Join(prepared.steps, ", "))
	start := time.Now()
	again, err := upstream.Materialise(t.Context(), upstream.Options{Local: upstream.LocalCheckout()})
	require.NoError(t, err)
	assert.Equal(t, first.Dir, again.Dir)
	assert.Less(t, time.Since(start), 5*time.Second, "a second run reuses the copy")

	files := func(tags ...string) string {
		args := []string{"list", "-f", "{{.GoFiles}} {{.TestGoFiles}}"}
		if len(tags) > 0 {
			args = append(args, "-tags", strings.Join(tags, ","))
		}
		cmd := exec.Command(gotest.GoCommand(), append(args, "./pkg/scheduler/backend/api_dispatcher")...)
		cmd.Dir, cmd.Env = first.Dir, append(os.Environ(), "GOWORK=off")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.TrimSpace(string(out))
	}
	assert.Equal(t, "[api_dispatcher_dispatch.go] [api_dispatcher_dispatch_test.go api_dispatcher_test.go]", files())
	assert.Equal(t, "[api_dispatcher.go call_queue.go goroutines_limiter.go] [api_dispatcher_test.go call_queue_test.go goroutines_limiter_test.go]", files(upstream.BaselineTag))
	assert.Contains(t, first.GoMod(), "k8s.io/kubernetes => "+first.Dir)
}

// TestAPIDispatcherPackage runs the api_dispatcher package's tests in the
// copy: upstream's test of the exported API against the drop-in, and
// every test of the package against upstream's own (the baseline).
func TestAPIDispatcherPackage(t *testing.T) {
	ours := goTest(t, unit, []string{dispatcherPkg})
	require.NoError(t, ours.Err)
	assert.Equal(t, map[string]string{upstream.Package + ".TestAPIDispatcherLifecycle": "pass"}, ours.Tests)

	theirs := goTest(t, unit, []string{"-tags", upstream.BaselineTag, dispatcherPkg})
	require.NoError(t, theirs.Err)
	assert.Equal(t, "pass", theirs.Tests[upstream.Package+".TestAPIDispatcherLifecycle"])
	topLevel := func(test string) bool { return !strings.Contains(strings.TrimPrefix(test, upstream.Package+"."), "/") }
	assert.Equal(t, 7, theirs.Count("pass", topLevel),
		"the lifecycle test, five tests of callQueue and one of goroutinesLimiter: %v", theirs.Tests)
}

// etcdOnPath returns a PATH with the etcd that test/integration uses
// first: upstream's integration tests start "etcd" from PATH.
func etcdOnPath(t *testing.T) string {
	etcd, err := apiserver.EtcdBinary(t)
	require.NoError(t, err)
	return "PATH=" + filepath.Dir(etcd) + string(os.PathListSeparator) + os.Getenv("PATH")
}

// TestIntegrationBind runs upstream's integration test of binding
// (test/integration/scheduler/bind: a scheduler and a kube-apiserver in
// process, with the gate on and off) against the drop-in, as upstream's
// CI runs it (upstreamFlags).
func TestIntegrationBind(t *testing.T) {
	materialised(t) // skips before etcdOnPath builds anything
	s := goTest(t, integration, []string{bindPkg}, etcdOnPath(t))
	require.NoError(t, s.Err)
	assert.Equal(t, "pass", s.Tests["k8s.io/kubernetes/test/integration/scheduler/bind.TestDefaultBinder/Async_API_calls_enabled:_true"], "%v", s.Tests)
	assert.Zero(t, s.Count("fail", nil))
}

// TestKubeSchedulerBinary runs k8s.io/kubernetes/cmd/kube-scheduler, as
// TestMain built it from the copy with one command (go run
// ./cmd/materialise -build), against a real kube-apiserver with
// SchedulerAsyncAPICalls on, and watches it bind a pod through the
// drop-in.
func TestKubeSchedulerBinary(t *testing.T) {
	materialised(t)
	bin := prepared.scheduler
	version := exec.Command(gotest.GoCommand(), "version", "-m", bin)
	out, err := version.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "github.com/coalescer/dispatch/kube/scheduler", "the binary links the adapter")

	s := apiserver.Start(t)
	kubeconfig := writeKubeconfig(t, s)
	ctx := t.Context()
	var logs syncBuffer
	sched := exec.CommandContext(ctx, bin,
		"--kubeconfig="+kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--feature-gates=SchedulerAsyncAPICalls=true",
		"-v=3",
	)
	sched.Stdout, sched.Stderr = &logs, &logs
	require.NoError(t, sched.Start())
	exited := make(chan error, 1)
	go func() { exited <- sched.Wait() }()
	t.Cleanup(func() {
		sched.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			sched.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("kube-scheduler's log:\n%s", logs.String())
		}
	})

	ns := "dispatch-e2e"
	_, err = s.AdminClient.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = s.AdminClient.CoreV1().Nodes().Create(ctx, &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Status: v1.NodeStatus{
			Capacity:    v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("8Gi"), v1.ResourcePods: resource.MustParse("110")},
			Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("8Gi"), v1.ResourcePods: resource.MustParse("110")},
			Conditions:  []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod, err := s.AdminClient.CoreV1().Pods(ns).Create(ctx, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: v1.PodSpec{
			Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
			// kube-apiserver taints a new node not-ready (TaintNodesByCondition)
			// and no node lifecycle controller runs here to lift it.
			Tolerations: []v1.Toleration{{Operator: v1.TolerationOpExists}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	w, err := s.AdminClient.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	require.NoError(t, err)
	defer w.Stop()
	deadline := time.After(2 * time.Minute)
	for bound := false; !bound; {
		select {
		case ev, ok := <-w.ResultChan():
			require.True(t, ok, "the watch ended")
			if p, ok := ev.Object.(*v1.Pod); ok && p.Spec.NodeName != "" {
				assert.Equal(t, "node-1", p.Spec.NodeName)
				bound = true
			}
		case err := <-exited:
			t.Fatalf("kube-scheduler exited: %v\n%s", err, logs.String())
		case <-deadline:
			t.Fatalf("the pod was not bound within 2 minutes; kube-scheduler's log:\n%s", logs.String())
		}
	}
	// The proxy records a request when the apiserver's answer reaches it,
	// which may be after the watch has shown the pod bound.
	binding := func() bool {
		return slices.ContainsFunc(s.Proxy.PodWrites(ns, pod.Name), func(r apiserver.Request) bool {
			return r.Subresource == "binding" && r.Status == http.StatusCreated
		})
	}
	require.Eventually(t, binding, 30*time.Second, 10*time.Millisecond,
		"the binding went through the proxy, from kube-scheduler's client: %v", s.Proxy.PodWrites(ns, pod.Name))
	assert.Contains(t, logs.String(), `"API dispatcher started" dispatcher="github.com/coalescer/dispatch/kube/scheduler"`)
	assert.Contains(t, logs.String(), "taken from the client's own limiter before each call is chosen")
}

// writeKubeconfig writes a kubeconfig for s.Config: through the proxy, as
// the test user.
func writeKubeconfig(t *testing.T, s *apiserver.Server) string {
	c := s.Config
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{
		Server:                   c.Host,
		CertificateAuthorityData: c.TLSClientConfig.CAData,
		InsecureSkipTLSVerify:    c.TLSClientConfig.Insecure,
		TLSServerName:            c.TLSClientConfig.ServerName,
	}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{
		Token:                 c.BearerToken,
		ClientCertificateData: c.TLSClientConfig.CertData,
		ClientKeyData:         c.TLSClientConfig.KeyData,
	}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	return path
}

// syncBuffer is a bytes.Buffer safe for the writes of a child process's
// two pipes and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
