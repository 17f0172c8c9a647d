// Command modfile prints the go.mod file that builds the storm module
// against one of the variants package variant knows: "upstream"
// (k8s.io/kubernetes v1.37.2 as released: this module's own go.mod) or
// "dispatch" (the copy of that release with dispatch's drop-in, which it
// materialises first, once per machine). Use it with -modfile, outside the
// workspace:
//
//	GOWORK=off go test -modfile=$(go run ./cmd/modfile dispatch) -mod=mod -run '^$' -bench . ./perf
//
// The generated file and its go.sum live under the user's cache directory
// (dispatch-storm/ in ~/.cache on Linux).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/coalescer/dispatch/test/storm/internal/variant"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: modfile upstream|dispatch")
		os.Exit(2)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	name, err := variant.Modfile(context.Background(), os.Args[1], filepath.Join(cache, "dispatch-storm"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "modfile:", err)
		os.Exit(1)
	}
	fmt.Println(name)
}
