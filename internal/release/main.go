// Command release checks that this repository's published modules install
// with go get, as a new user meets them, before any of them is tagged
// (RELEASING.md).
//
// check (the default; .ci/run runs it) fails unless all of these hold:
//
//   - Every published module's go.mod has no replace directive (a replace
//     applies only in its own module, never for a user), sits where its
//     path says (so that its tag is its directory plus the version), and
//     has a LICENSE beside it (its zip holds nothing above its directory).
//   - Every module in the repository that requires one of ours requires it
//     at the release version (and a published one only published ones), and
//     go.work uses every module and points the release version of each
//     published one, and of each one another requires, at its directory.
//   - The README's Install section runs go get on exactly the published
//     modules at the release version.
//   - A module proxy directory built from the working tree, one zip per
//     published module made and checked by golang.org/x/mod/zip (names,
//     sizes, the proxy's 500 MiB limit), serves every module: in an empty
//     module outside the repository, with GOWORK=off, the README's go get
//     lines, then go build, give a program (testdata/consumer) that uses the
//     core, kube and prometheus modules, and its output is
//     testdata/consumer/want.txt. The build may add nothing go get did not
//     select.
//   - Every module's go.mod and go.sum are what go mod tidy makes of them
//     on their own (GOWORK=off), with our modules served by that proxy;
//     go.sum files leave out our own modules (see tidy).
//
// proxy DIR writes the proxy directory, for trying things by hand:
//
//	GOWORK=off GOPROXY=file://DIR,$(go env GOPROXY) GONOSUMDB=github.com/coalescer/dispatch go ...
//
// tidy runs go mod tidy in every module against that proxy, then removes
// our own modules' lines from each go.sum: until they are tagged, their
// checksums would be those of the working tree, different at every commit,
// and go.work builds them from the tree, so no build reads them. It is how
// go.mod and go.sum files are kept tidy in this repository; go mod tidy alone
// cannot find the release version of our modules before it is tagged.
//
// Modules under a testdata directory are test data; they are neither
// published nor checked. A module is published unless the comment above the
// module line of its go.mod starts with "Unpublished:".
//
// Usage:
//
//	go run ./internal/release [-version v0.1.0] [-root DIR] [-keep] [check | proxy DIR | tidy]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
)

func main() {
	version := flag.String("version", "v0.1.0", "the release being prepared")
	root := flag.String("root", "", "the repository's root (default: the directory of the go.work above the current one)")
	keep := flag.Bool("keep", false, "keep the temporary directory (proxy, module cache, consumer) and print its name")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: release [flags] [check | proxy DIR | tidy]\n")
		flag.PrintDefaults()
	}
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *root, *version, *keep, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, root, version string, keep bool, args []string) error {
	if root == "" {
		var err error
		if root, err = findRoot(); err != nil {
			return err
		}
	}
	r, err := loadRepo(root, version)
	if err != nil {
		return err
	}
	cmd := "check"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch {
	case cmd == "proxy" && len(args) == 1:
		return r.buildProxy(args[0])
	case cmd == "tidy" && len(args) == 0:
		return withWork(keep, func(w *work) error { return r.tidy(ctx, w) })
	case cmd == "check" && len(args) == 0:
		if err := errors.Join(r.lint()...); err != nil {
			return err
		}
		return withWork(keep, func(w *work) error { return r.check(ctx, w) })
	}
	flag.Usage()
	return fmt.Errorf("bad arguments: %q", append([]string{cmd}, args...))
}

// check runs what lint cannot: the proxy, go mod tidy, the consumer.
func (r *repo) check(ctx context.Context, w *work) error {
	if err := r.buildProxy(w.proxy); err != nil {
		return err
	}
	fmt.Printf("proxy: %s at %s in %s\n", r.publishedPaths(), r.version, w.proxy)
	if err := r.tidyCheck(ctx, w); err != nil {
		return err
	}
	return r.consumer(ctx, w)
}

// withWork runs f with a fresh temporary directory and removes it after,
// unless keep.
func withWork(keep bool, f func(*work) error) error {
	w, err := newWork()
	if err != nil {
		return err
	}
	err = f(w)
	if keep {
		fmt.Println("kept", w.dir)
		return err
	}
	return errors.Join(err, w.remove())
}
