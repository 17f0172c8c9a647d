package main

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// consumerMain is the program a new user writes: testdata/consumer/main.go.
//
//go:embed testdata/consumer/main.go
var consumerMain []byte

// consumerWant is its output.
//
//go:embed testdata/consumer/want.txt
var consumerWant string

// consumer builds and runs consumerMain in an empty module outside the
// repository, with nothing but the README's go get lines, against the proxy.
func (r *repo) consumer(ctx context.Context, w *work) error {
	dir := filepath.Join(w.dir, "consumer")
	if within(r.root, dir) {
		return fmt.Errorf("the consumer's module %s is inside the repository: set TMPDIR elsewhere", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if _, err := r.goIn(ctx, w, dir, "mod", "init", "example.com/consumer"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), consumerMain, 0o644); err != nil {
		return err
	}
	lines, err := installLines(r.readme)
	if err != nil {
		return err
	}
	for _, l := range lines {
		fmt.Println("consumer:", strings.Join(l, " "))
		if _, err := r.goIn(ctx, w, dir, l[1:]...); err != nil {
			return err
		}
	}
	selected, err := r.goIn(ctx, w, dir, "list", "-m", "all")
	if err != nil {
		return err
	}
	for l := range strings.Lines(selected) {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if m := r.module(f[0]); m != nil && !m.published {
			return fmt.Errorf("consumer: go get selected %s, which is not published", m.path)
		}
	}
	for _, m := range r.published() {
		out, err := r.goIn(ctx, w, dir, "list", "-m", "-f", "{{.Version}} {{with .Replace}}replaced by {{.Path}}{{end}}|{{.Dir}}", m.path)
		if err != nil {
			return err
		}
		got, mdir, _ := strings.Cut(strings.TrimSpace(out), "|")
		if strings.TrimSpace(got) != r.version || !within(w.modcache, mdir) {
			return fmt.Errorf("consumer: %s is %s from %s; want %s from the proxy", m.path, got, mdir, r.version)
		}
	}

	// -trimpath: the packages' paths are in this run's module cache, so the
	// build cache would miss every time without it.
	fmt.Println("consumer: go vet, go build")
	if _, err := r.goIn(ctx, w, dir, "vet", "-trimpath", "."); err != nil {
		return err
	}
	bin := filepath.Join(dir, "consumer")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	if _, err := r.goIn(ctx, w, dir, "build", "-trimpath", "-o", bin, "."); err != nil {
		return err
	}
	after, err := r.goIn(ctx, w, dir, "list", "-m", "all")
	if err != nil {
		return err
	}
	if after != selected {
		return fmt.Errorf("consumer: the build needed modules go get did not select:\nafter go get:\n%s\nafter go build:\n%s", selected, after)
	}

	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("consumer: %w\n%s%s", err, stdout.Bytes(), stderr.Bytes())
	}
	if stdout.String() != consumerWant {
		return fmt.Errorf("consumer printed:\n%s\nwant (testdata/consumer/want.txt):\n%s", stdout.Bytes(), consumerWant)
	}
	fmt.Print("consumer: ok\n", stdout.String())
	return nil
}
