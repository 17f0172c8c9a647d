package apiserver

import (
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestStartEtcd starts the etcd [EtcdBinary] finds or builds, and writes and
// reads a key through its HTTP gateway.
func TestStartEtcd(t *testing.T) {
	e := StartEtcd(t)
	t.Logf("%s at %s", e.Version, e.URL)
	if !strings.HasPrefix(e.Version, "etcd Version: ") {
		t.Errorf("Version = %q, want etcd Version: …", e.Version)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	b64 := base64.StdEncoding.EncodeToString
	post := func(path, body string) string {
		t.Helper()
		resp, err := client.Post(e.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %s %s %v", path, resp.Status, got, err)
		}
		return string(got)
	}
	post("/v3/kv/put", `{"key":"`+b64([]byte("k"))+`","value":"`+b64([]byte("v"))+`"}`)
	if got := post("/v3/kv/range", `{"key":"`+b64([]byte("k"))+`"}`); !strings.Contains(got, `"value":"`+b64([]byte("v"))+`"`) {
		t.Fatalf("range k = %s, want the value v", got)
	}
}

// TestEtcdSourceKey: the testdata/etcd module pins an etcd server release, which
// names the directory its build is cached in.
func TestEtcdSourceKey(t *testing.T) {
	version, hash, err := etcdBuild.sourceKey("testdata/etcd")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(version, "v3.") || len(hash) != 12 {
		t.Fatalf("sourceKey = %q, %q, want v3.x and 12 hex digits", version, hash)
	}
	for _, tc := range []struct{ gomod, want string }{
		{"module m\n\nrequire " + etcdBuild.module + " v3.7.3\n", "v3.7.3"},
		{"module m\n\nrequire (\n\t" + etcdBuild.module + " v3.6.16 // indirect\n)\n", "v3.6.16"},
		{"module m\n\nrequire " + etcdBuild.module + "/x v1.0.0\n", ""},
	} {
		if got := requiredVersion([]byte(tc.gomod), etcdBuild.module); got != tc.want {
			t.Errorf("requiredVersion(%q) = %q, want %q", tc.gomod, got, tc.want)
		}
	}
}
