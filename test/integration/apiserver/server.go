package apiserver

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
)

// Identity of the unprivileged user that Server.Config authenticates as,
// through a static token file. The default authorization mode of the test
// server (AlwaysAllow) lets it do anything, but it is outside the
// system:masters group, so the inflight limits and API Priority and Fairness
// apply to it.
const (
	// TestUser is the user name of Server.Config.
	TestUser = "dispatch-test"
	// TestGroup is the one group of Server.Config's user, besides
	// system:authenticated.
	TestGroup = "dispatch-testers"
)

// Server is a kube-apiserver running in the test process, backed by an etcd
// of its own, with a [Proxy] in front of it.
type Server struct {
	// Config reaches the apiserver through Proxy as [TestUser], with the
	// options' QPS and Burst. Give it (or Client) to the code under test.
	Config *rest.Config
	// Client is a clientset built from Config.
	Client kubernetes.Interface
	// AdminConfig reaches the apiserver directly as the loopback superuser
	// (group system:masters): never throttled, never recorded by Proxy, no
	// client-side rate limit. Use it for setup and to check the outcome.
	AdminConfig *rest.Config
	// AdminClient is a clientset built from AdminConfig.
	AdminClient kubernetes.Interface
	// Proxy is between Config and the apiserver: it records what Config's
	// users send and drops responses when armed.
	Proxy *Proxy
	// Etcd is the etcd the apiserver stores into.
	Etcd *Etcd
	// StartupTime is how long the apiserver took from the start of its
	// configuration to a healthy /healthz and a default namespace.
	StartupTime time.Duration
}

// Option configures [Start].
type Option func(*options)

type options struct {
	flags []string
	qps   float32
	burst int
	etcd  *Etcd
}

// WithFlags adds kube-apiserver command-line flags, such as
// "--max-requests-inflight=1". Later flags override earlier ones.
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

// Start starts etcd (unless [WithEtcd]), kube-apiserver in-process, and the
// proxy, and stops them all when the test ends. It fails the test if any of
// them does not start.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := options{qps: -1}
	for _, opt := range opts {
		opt(&o)
	}
	s := &Server{Etcd: o.etcd}
	if s.Etcd == nil {
		s.Etcd = StartEtcd(t)
	}

	id := randomHex(8)
	token := randomHex(16)
	tokenFile := filepath.Join(t.TempDir(), "tokens.csv")
	// A static token file: token,user,uid,"group1,group2".
	line := fmt.Sprintf("%s,%s,%s-uid,%q\n", token, TestUser, TestUser, TestGroup)
	if err := os.WriteFile(tokenFile, []byte(line), 0o600); err != nil {
		t.Fatalf("apiserver: %v", err)
	}

	storage := storagebackend.NewDefaultConfig(path.Join("/dispatch-"+id, "registry"), nil)
	storage.Transport.ServerList = []string{s.Etcd.URL}
	flags := append([]string{
		"--token-auth-file=" + tokenFile,
		// No controller-manager runs to create each namespace's default
		// service account, which this admission plugin requires of a pod.
		"--disable-admission-plugins=ServiceAccount",
	}, o.flags...)

	began := time.Now()
	// No client-certificate or front-proxy authentication: Config uses a
	// token and no aggregated API is served. With it, client-go starts a
	// certificate-reloading loop for the front-proxy client that never ends.
	//
	// No invariant checks at teardown: they check kube-apiserver's own
	// metrics (its declarative validation's mismatch and panic counters),
	// nothing of the code under test, through a scrape of /metrics that
	// they give 5 seconds, and on a loaded machine the scrape of a server
	// that has just served a storm can take longer and fail the test.
	instance := &kubeapiservertesting.TestServerInstanceOptions{EnableCertAuth: false, DisableInvariantChecks: true}
	ts := kubeapiservertesting.StartTestServerOrDie(t, instance, flags, storage)
	s.StartupTime = time.Since(began)
	t.Cleanup(ts.TearDownFn)
	t.Logf("apiserver: healthy at %s after %v (etcd %s at %s, %s)",
		ts.ClientConfig.Host, s.StartupTime.Round(time.Millisecond), s.Etcd.Version, s.Etcd.URL, storage.Prefix)

	s.AdminConfig = rest.CopyConfig(ts.ClientConfig)
	s.AdminConfig.QPS, s.AdminConfig.Burst = -1, 0
	s.Proxy = NewProxy(t, ts.ClientConfig)
	s.Config = s.Proxy.ClientConfig(&rest.Config{
		BearerToken: token,
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
	return s
}

// randomHex returns n random bytes, hex-encoded.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b)
}
