// Command materialise makes a copy of k8s.io/kubernetes whose
// pkg/scheduler/backend/api_dispatcher is dispatch's drop-in, and prints
// what a consumer's go.mod (or go.work, with -gowork) needs to build
// against it:
//
//	go run github.com/coalescer/dispatch/dropin/cmd/materialise
//
// The copy goes to dispatch-kubernetes/ under the user's cache directory
// (-dir to change it), at a path that depends only on what goes into it, and
// is reused by later runs. With -local (the default when run from a checkout
// of github.com/coalescer/dispatch) the copy uses that checkout's modules.
// Build kube-scheduler with dispatch inside, in one command (-build makes
// the copy if needed, then builds kube-scheduler in it; it prints nothing
// unless -print says so):
//
//	go run ./dropin/cmd/materialise -build ./kube-scheduler
//
// and with upstream's own dispatcher, from the same copy, by adding
// -tags dispatch_upstream. By hand, that is:
//
//	cd "$(go run ./dropin/cmd/materialise -print dir)" &&
//	    GOWORK=off go build -o kube-scheduler ./cmd/kube-scheduler
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"

	"github.com/coalescer/dispatch/dropin"
)

func main() {
	dir := flag.String("dir", "", "directory to make copies in (default: dispatch-kubernetes under the user cache directory)")
	local := flag.String("local", upstream.LocalCheckout(), "checkout of github.com/coalescer/dispatch whose modules the copy uses; empty: the published modules")
	print := flag.String("print", "gomod", "what to print: gomod (lines for a consumer's go.mod), gowork (for a go.work), dir (the copy's path), none")
	out := flag.String("o", "", "also write the go.mod lines to this file")
	quiet := flag.Bool("q", false, "do not log the steps to stderr")
	build := flag.String("build", "", "then build kube-scheduler from the copy into this file (and print nothing unless -print is given)")
	tags := flag.String("tags", "", "build tags for -build ("+upstream.BaselineTag+": upstream's own dispatcher)")
	flag.Parse()
	printSet := false
	flag.Visit(func(f *flag.Flag) { printSet = printSet || f.Name == "print" })

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
	if *build != "" {
		var flags []string
		if *tags != "" {
			flags = []string{"-tags", *tags}
		}
		if !*quiet {
			fmt.Fprintf(os.Stderr, "materialise: building kube-scheduler in %s\n", t.Dir)
		}
		if err := t.Build(ctx, upstream.KubeScheduler, *build, flags...); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if !*quiet {
			fmt.Fprintln(os.Stderr, "materialise: built", filepath.Clean(*build))
		}
		if !printSet {
			*print = "none"
		}
	}
	switch *print {
	case "none":
	case "gomod":
		fmt.Print(t.GoMod())
	case "gowork":
		fmt.Print(t.GoWork())
	case "dir":
		fmt.Println(t.Dir)
	default:
		fmt.Fprintf(os.Stderr, "materialise: -print %q: want gomod, gowork, dir or none\n", *print)
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
