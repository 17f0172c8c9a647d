package apiserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Identity of the unprivileged user that Server.Config authenticates as,
// through a static token file. The default authorization mode
// (AlwaysAllow) lets it do anything, but it is outside the system:masters
// group, so the inflight limits and API Priority and Fairness apply to it.
const (
	// TestUser is the user name of Server.Config.
	TestUser = "dispatch-test"
	// TestGroup is the one group of Server.Config's user, besides
	// system:authenticated.
	TestGroup = "dispatch-testers"
)

// KubeAPIServerBinaryEnv names the environment variable that, when set, is
// the path of the kube-apiserver binary to run; otherwise
// [KubeAPIServerBinary] builds one with the go command.
const KubeAPIServerBinaryEnv = "KUBE_APISERVER_BIN"

// Bounds on a kube-apiserver's start and stop: only a hung server meets
// them.
const (
	// apiserverStartTimeout bounds the wait for /readyz and the default
	// namespace: a few seconds on an idle machine, much longer on a
	// loaded one where several servers start at once.
	apiserverStartTimeout = 3 * time.Minute
	// apiserverStopTimeout bounds the graceful shutdown after SIGTERM,
	// after which the process is killed.
	apiserverStopTimeout = 15 * time.Second
)

// Server is a kube-apiserver running as a child process of the test
// binary, backed by an etcd, with a [Proxy] in front of it.
type Server struct {
	// Config reaches the apiserver through Proxy as [TestUser], with the
	// options' QPS and Burst. Give it (or Client) to the code under test.
	Config *rest.Config
	// Client is a clientset built from Config.
	Client kubernetes.Interface
	// AdminConfig reaches the apiserver directly as a superuser (group
	// system:masters): never throttled, never recorded by Proxy, no
	// client-side rate limit, allowed everything whatever the
	// authorization mode. Use it for setup and to check the outcome.
	AdminConfig *rest.Config
	// AdminClient is a clientset built from AdminConfig.
	AdminClient kubernetes.Interface
	// Proxy is between Config and the apiserver: it records what Config's
	// users send and drops responses when armed.
	Proxy *Proxy
	// Etcd is the etcd the apiserver stores into.
	Etcd *Etcd
	// StartupTime is how long the apiserver took from the start of its
	// process to a ready /readyz and a default namespace.
	StartupTime time.Duration

	proc *child
}

// Output returns the latest of what kube-apiserver has logged (its
// standard output and error, up to a megabyte). Start logs it into the
// test's output when the test fails.
func (s *Server) Output() string { return s.proc.output.String() }

// Option configures [Start].
type Option func(*options)

type options struct {
	flags []string
	qps   float32
	burst int
	etcd  *Etcd
}

// WithFlags adds kube-apiserver command-line flags, such as
// "--max-requests-inflight=1" or "--authorization-mode=RBAC". They come
// after Start's own, so a flag with one value overrides Start's, and a
// list flag adds to Start's values: Start disables the ServiceAccount
// admission plugin (no controller creates the default service accounts),
// so "--disable-admission-plugins=TaintNodesByCondition" disables both.
//
// Start sets the flags of the serving certificate, the etcd, the port and
// authentication: a static token file (for [TestUser] and the admin) and
// service account tokens signed with a key of the server's own (see
// [Server.ServiceAccountConfig]). It leaves the authorization mode at
// kube-apiserver's default, AlwaysAllow; with "--authorization-mode=RBAC",
// [TestUser] and service accounts may do what their roles and bindings
// allow, and AdminConfig still everything.
func WithFlags(flags ...string) Option {
	return func(o *options) { o.flags = append(o.flags, flags...) }
}

// WithInflightLimits sets --max-requests-inflight (readOnly) and
// --max-mutating-requests-inflight (mutating), and turns API Priority and
// Fairness off: with it on, the two limits only size its queues, and a
// request over the limit waits in a queue instead of getting 429 at once.
// With it off, a request of Config's user over the limit gets
// 429 TooManyRequests with Retry-After: 1 straight away (system:masters,
// hence AdminConfig, is never refused).
func WithInflightLimits(readOnly, mutating int) Option {
	return WithFlags(
		"--enable-priority-and-fairness=false",
		"--max-requests-inflight="+strconv.Itoa(readOnly),
		"--max-mutating-requests-inflight="+strconv.Itoa(mutating),
	)
}

// WithClientRate sets Config's client-side rate limit: QPS and Burst as in
// rest.Config. The default is no client-side limit (QPS -1), so that only
// the server throttles.
func WithClientRate(qps float32, burst int) Option {
	return func(o *options) { o.qps, o.burst = qps, burst }
}

// WithEtcd stores into e, under a prefix of the server's own, instead of
// starting an etcd for this server: several servers of one test can share
// one etcd.
func WithEtcd(e *Etcd) Option {
	return func(o *options) { o.etcd = e }
}

// KubeAPIServerBinary returns the path of the kube-apiserver binary:
// $KUBE_APISERVER_BIN when set, else upstream's cmd/kube-apiserver at the
// release the module testdata/kube-apiserver pins (Kubernetes 1.37), built
// without the race detector once per machine into the user's cache
// directory (see [pinnedBuild.build]). No kube-apiserver in $PATH is used:
// the tests are written against one release.
func KubeAPIServerBinary(t testing.TB) (string, error) {
	t.Helper()
	if p := os.Getenv(KubeAPIServerBinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s=%q: %w", KubeAPIServerBinaryEnv, p, err)
		}
		return p, nil
	}
	p, err := kubeAPIServerBuild.binary(t)
	if err != nil {
		return "", fmt.Errorf("no kube-apiserver binary: $%s is unset, and building one with Go failed: %w",
			KubeAPIServerBinaryEnv, err)
	}
	return p, nil
}

// Start starts etcd (unless [WithEtcd]), kube-apiserver in a process of its
// own, and the proxy, and stops them all when the test ends. It fails the
// test if any of them does not start.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := options{qps: -1}
	for _, opt := range opts {
		opt(&o)
	}
	bin, err := KubeAPIServerBinary(t)
	if err != nil {
		t.Fatalf("apiserver: %v", err)
	}
	s := &Server{Etcd: o.etcd}
	if s.Etcd == nil {
		s.Etcd = StartEtcd(t)
	}
	dir := t.TempDir()
	creds, err := newCredentials(dir)
	if err != nil {
		t.Fatalf("apiserver: credentials: %v", err)
	}
	host := s.startOnFreePort(t, bin, dir, creds, o.flags)
	s.connect(t, host, creds, o)
	return s
}

// startOnFreePort starts kube-apiserver (see [Server.start]), each time
// under an etcd prefix of its own, and returns its URL. It fails the test
// if the server does not start.
//
// The port is free when picked but closed again before kube-apiserver
// binds it, so another process may take it in between: it retries a few
// times when that is why the server exited.
func (s *Server) startOnFreePort(t testing.TB, bin, dir string, creds *credentials, flags []string) string {
	t.Helper()
	const attempts = 5
	for i := 1; ; i++ {
		prefix := path.Join("/dispatch-"+randomHex(8), "registry")
		host, err := s.start(t, bin, dir, creds, prefix, flags)
		if err == nil {
			t.Logf("apiserver: ready at %s after %v (etcd %s at %s, %s)",
				host, s.StartupTime.Round(time.Millisecond), s.Etcd.Version, s.Etcd.URL, prefix)
			return host
		}
		if i == attempts || !errors.Is(err, errPortTaken) {
			t.Fatalf("apiserver: %v", err)
		}
		t.Logf("apiserver: attempt %d: %v; retrying on another port", i, err)
	}
}

// connect sets s's configs, proxy and clients for the server at host: the
// admin's straight to it, the test user's through a new [Proxy] at the
// client-side rate that o sets.
func (s *Server) connect(t testing.TB, host string, creds *credentials, o options) {
	t.Helper()
	tlsConfig := rest.TLSClientConfig{CAData: creds.caPEM}
	s.AdminConfig = &rest.Config{
		Host:            host,
		TLSClientConfig: tlsConfig,
		BearerToken:     creds.adminToken,
		QPS:             -1,
		UserAgent:       "dispatch-integration-test-admin",
	}
	s.Proxy = NewProxy(t, &rest.Config{Host: host, TLSClientConfig: tlsConfig})
	s.Config = s.Proxy.ClientConfig(&rest.Config{
		BearerToken: creds.testToken,
		QPS:         o.qps,
		Burst:       o.burst,
		UserAgent:   "dispatch-integration-test",
	})
	var err error
	if s.Client, err = kubernetes.NewForConfig(s.Config); err != nil {
		t.Fatalf("apiserver: client: %v", err)
	}
	if s.AdminClient, err = kubernetes.NewForConfig(s.AdminConfig); err != nil {
		t.Fatalf("apiserver: admin client: %v", err)
	}
}

// errPortTaken: kube-apiserver exited at start because its port was taken.
var errPortTaken = errors.New("kube-apiserver's port was taken")

// start runs kube-apiserver on a free port and waits until it is ready,
// and returns its URL, https://127.0.0.1:PORT. On success the process is
// stopped when the test ends; on an error it is stopped already.
func (s *Server) start(t testing.TB, bin, dir string, creds *credentials, prefix string, flags []string) (string, error) {
	ports, err := freePorts(1)
	if err != nil {
		return "", err
	}
	port := strconv.Itoa(ports[0])
	host := "https://127.0.0.1:" + port
	args := append(creds.flags(),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+port,
		"--cert-dir="+dir,
		"--etcd-servers="+s.Etcd.URL,
		"--etcd-prefix="+prefix,
		// One server per test, no cluster: nothing reads the endpoints of
		// the kubernetes service, whose loopback address the endpoint
		// validation would refuse anyway.
		"--endpoint-reconciler-type=none",
		// No controller-manager runs to create each namespace's default
		// service account, which this admission plugin requires of a pod.
		"--disable-admission-plugins=ServiceAccount",
	)
	args = append(args, flags...)

	began := time.Now()
	s.proc, err = startChild(bin, args...)
	if err != nil {
		return "", err
	}
	if err := waitReady(host, creds, s.proc, apiserverStartTimeout); err != nil {
		s.proc.stop(apiserverStopTimeout)
		out := s.Output()
		if strings.Contains(out, "address already in use") {
			return "", fmt.Errorf("%w: %v", errPortTaken, err)
		}
		return "", fmt.Errorf("%w\nkube-apiserver %s\nkube-apiserver output (tail):\n%s",
			err, strings.Join(args, " "), tail([]byte(out), 16<<10))
	}
	s.StartupTime = time.Since(began)
	proc := s.proc
	t.Cleanup(func() {
		proc.stop(apiserverStopTimeout)
		if t.Failed() {
			t.Logf("kube-apiserver output (tail):\n%s", tail([]byte(proc.output.String()), 16<<10))
		}
	})
	return host, nil
}

// waitReady polls the server at host until /readyz answers ok and the
// default namespace exists, the process exits or timeout passes.
func waitReady(host string, creds *credentials, proc *child, timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(creds.caPEM)
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	get := func(path string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+creds.adminToken)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
		}
		return nil
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		last = get("/readyz")
		if last == nil {
			// The bootstrap controller creates it after /readyz may pass.
			last = get("/api/v1/namespaces/default")
		}
		if last == nil {
			return nil
		}
		select {
		case <-proc.done:
			return fmt.Errorf("kube-apiserver exited at start: %v", proc.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready after %v: %v", timeout, last)
		case <-tick.C:
		}
	}
}

// ServiceAccountConfig returns a config like Config — through Proxy, with
// Config's client-side rate limit — that authenticates as the service
// account name in namespace, with a token the server issues for an hour
// (a TokenRequest, as the kubelet makes for a pod). It creates the service
// account if it does not exist; the namespace must. Its user is
// system:serviceaccount:NAMESPACE:NAME, in the groups
// system:serviceaccounts and system:serviceaccounts:NAMESPACE.
func (s *Server) ServiceAccountConfig(t testing.TB, namespace, name string) *rest.Config {
	t.Helper()
	ctx := context.Background() // t.Context() is done in cleanups
	accounts := s.AdminClient.CoreV1().ServiceAccounts(namespace)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := accounts.Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("apiserver: service account %s/%s: %v", namespace, name, err)
	}
	hour := int64(time.Hour / time.Second)
	tr, err := accounts.CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("apiserver: token for service account %s/%s: %v", namespace, name, err)
	}
	c := rest.CopyConfig(s.Config)
	c.BearerToken = tr.Status.Token
	c.UserAgent = "dispatch-integration-test-" + name
	return c
}
