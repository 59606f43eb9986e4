// Command runnel is Runnel's one binary: the node (`runnel dev`) and the command line that talks to it
// (topic, produce, consume, bench, demo). Run `runnel --help` for the verbs.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// The first SIGINT/SIGTERM cancels the context so commands can stop cleanly; after that the default
	// handling is back, so a second Ctrl-C ends the process at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
