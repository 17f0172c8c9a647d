// Command materialise makes a copy of k8s.io/kubernetes whose
// pkg/scheduler/backend/api_dispatcher is dispatch's drop-in, and prints
// what a consumer's go.mod (or go.work, with -gowork) needs to build
// against it:
//
//	go run github.com/coalescer/dispatch/kube/scheduler/upstream/cmd/materialise
//
// The copy goes to dispatch-kubernetes/ under the user's cache directory
// (-dir to change it), at a path that depends only on what goes into it, and
// is reused by later runs. With -local (the default when run from a checkout
// of github.com/coalescer/dispatch) the copy uses that checkout's modules.
// Build kube-scheduler with dispatch inside:
//
//	cd "$(go run ./kube/scheduler/upstream/cmd/materialise -print dir)" &&
//	    GOWORK=off go build -o kube-scheduler ./cmd/kube-scheduler
//
// and with upstream's own dispatcher, from the same copy, by adding
// -tags dispatch_upstream.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"

	"github.com/coalescer/dispatch/kube/scheduler/upstream"
)

func main() {
	dir := flag.String("dir", "", "directory to make copies in (default: dispatch-kubernetes under the user cache directory)")
	local := flag.String("local", upstream.LocalCheckout(), "checkout of github.com/coalescer/dispatch whose modules the copy uses; empty: the published modules")
	print := flag.String("print", "gomod", "what to print: gomod (lines for a consumer's go.mod), gowork (for a go.work), dir (the copy's path)")
	out := flag.String("o", "", "also write the go.mod lines to this file")
	quiet := flag.Bool("q", false, "do not log the steps to stderr")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	o := upstream.Options{Dir: *dir, Local: *local}
	if !*quiet {
		o.Log = os.Stderr
	}
	t, err := upstream.Materialise(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	switch *print {
	case "gomod":
		fmt.Print(t.GoMod())
	case "gowork":
		fmt.Print(t.GoWork())
	case "dir":
		fmt.Println(t.Dir)
	default:
		fmt.Fprintf(os.Stderr, "materialise: -print %q: want gomod, gowork or dir\n", *print)
		os.Exit(2)
	}
	if *out != "" {
		if err := os.WriteFile(*out, []byte(t.GoMod()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "materialise: wrote", filepath.Clean(*out))
	}
}
