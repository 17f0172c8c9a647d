package apiserver

import (
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
)

// slowBody is a request body whose bytes come after a delay, as when the
// client's writer is slow to be scheduled.
type slowBody struct {
	r    io.Reader
	from time.Time
}

func (b *slowBody) Read(p []byte) (int, error) {
	time.Sleep(time.Until(b.from))
	return b.r.Read(p)
}

// TestProxyEarlyAnswer: the apiserver answers a write before reading its
// body — a 429 from the inflight limit — and the client has not sent its
// body yet. client-go's HTTP/2 transport stops sending a body once it sees
// an answer above 299, without ending the stream; a proxy that streamed the
// body through would wait for the rest of it while the client waits for the
// end of the answer, both for ever. The client must get the whole answer.
func TestProxyEarlyAnswer(t *testing.T) {
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many requests", http.StatusTooManyRequests) // the body unread
	}))
	upstream.EnableHTTP2 = true
	upstream.StartTLS()
	defer upstream.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw})
	p, err := newProxy(&rest.Config{Host: upstream.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()

	rt, err := rest.TransportFor(p.ClientConfig(&rest.Config{})) // client-go's transport: x/net's HTTP/2
	if err != nil {
		t.Fatal(err)
	}
	defer utilnet.CloseIdleConnectionsFor(rt)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	body := &slowBody{r: strings.NewReader(`{"kind":"ConfigMap"}`), from: time.Now().Add(200 * time.Millisecond)}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL()+"/api/v1/namespaces/ns/configmaps", body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("proto %s, want HTTP/2", resp.Proto)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatalf("reading the answer: %v (the proxy never ended it)", err)
	}
	got := p.Requests()
	if len(got) != 1 || got[0].Status != http.StatusTooManyRequests || got[0].RetryAfter != time.Second {
		t.Fatalf("recorded %v, want one 429 with Retry-After 1s", got)
	}
}
