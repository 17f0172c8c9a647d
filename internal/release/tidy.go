package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// tidy runs go mod tidy in every module, on its own, with our modules
// served by the proxy at the release version, and then leaves our modules
// out of its go.sum (see the package documentation).
func (r *repo) tidy(ctx context.Context, w *work) error {
	if err := r.buildProxy(w.proxy); err != nil {
		return err
	}
	for _, m := range r.modules {
		fmt.Println("go mod tidy:", m.rel)
		if _, err := r.goIn(ctx, w, m.dir, "mod", "tidy"); err != nil {
			return err
		}
		name := filepath.Join(m.dir, "go.sum")
		data, err := os.ReadFile(name)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		var keep []string
		for l := range strings.Lines(string(data)) {
			if f := strings.Fields(l); len(f) == 0 || !r.ours(f[0]) {
				keep = append(keep, l)
			}
		}
		if err := os.WriteFile(name, []byte(strings.Join(keep, "")), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// tidyCheck fails unless tidy would change nothing.
func (r *repo) tidyCheck(ctx context.Context, w *work) error {
	var errs []error
	for _, m := range r.modules {
		out, err := r.goIn(ctx, w, m.dir, "mod", "tidy", "-diff")
		if err == nil {
			continue
		}
		if out == "" {
			errs = append(errs, err) // no diff: go mod tidy failed
			continue
		}
		if diff := r.untidy(out); diff != "" {
			errs = append(errs, fmt.Errorf("%s: not tidy (go run ./internal/release tidy fixes it):\n%s", path.Join(m.rel, "go.mod"), diff))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("tidy: %d modules\n", len(r.modules))
	return nil
}

// untidy returns the lines of a go mod tidy -diff output that matter: all
// but go.sum lines for our own modules.
func (r *repo) untidy(diff string) string {
	var b strings.Builder
	sum := false
	for l := range strings.Lines(diff) {
		switch {
		case strings.HasPrefix(l, "--- "), strings.HasPrefix(l, "+++ "):
			sum = strings.HasSuffix(strings.TrimSpace(l), "go.sum")
		case strings.HasPrefix(l, "+"), strings.HasPrefix(l, "-"):
			if f := strings.Fields(l[1:]); sum && len(f) > 0 && r.ours(f[0]) {
				continue
			}
			b.WriteString(l)
		}
	}
	return b.String()
}
