package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// defaultBrokers is where the client verbs look for a node when neither --brokers nor RUNNEL_BROKERS
// says otherwise: the gRPC address of `runnel dev`.
const defaultBrokers = "127.0.0.1:7070"

// app holds what the verbs share: the broker list and admin timeout flags.
type app struct {
	brokers string
	timeout time.Duration
}

// defaultAdminTimeout bounds admin and metadata calls, retries included, so a command against a node
// that is not there fails within seconds rather than the SDK's 30s.
const defaultAdminTimeout = 10 * time.Second

// usageError marks a mistake in the command line (exit status 2), as opposed to a failure (1).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitError ends the process with a given status after its message (if any) is printed.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// run executes the command line args and returns the process exit status: 0 on success, 1 on failure,
// 2 on a usage error, 130 when interrupted.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{}
	root := newRootCmd(a)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "runnel: %v\nRun 'runnel --help' or 'runnel COMMAND --help' for usage.\n", ue.err)
		return 2
	}
	fmt.Fprintf(stderr, "runnel: %s\n", describeError(err, a.brokers))
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "runnel",
		Short: "Runnel: a durable, partitioned log with a command line",
		Long: `Runnel is a durable, partitioned log (the job of Kafka, Redpanda or Pulsar).
This one binary is both the node and the command line.

Start a node with 'runnel dev', then in another terminal:

  runnel topic create hello -p 3
  echo 'hi there' | runnel produce hello
  runnel consume hello --max-messages 1

Client verbs find the node with --brokers or RUNNEL_BROKERS (default ` + defaultBrokers + `).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          groupArgs,
		RunE:          groupRun,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.CompletionOptions.HiddenDefaultCmd = true
	root.AddCommand(newDevCmd(), newServerCmd(), newClusterCmd(a), newTopicCmd(a), newGroupCmd(a), newTxnCmd(a), newProduceCmd(a), newConsumeCmd(a), newBenchCmd(a), newDemoCmd(a))
	return root
}

// addBrokersFlag registers --brokers on fs, defaulting to RUNNEL_BROKERS or 127.0.0.1:7070.
func addBrokersFlag(fs *pflag.FlagSet, a *app) {
	def := os.Getenv("RUNNEL_BROKERS")
	if def == "" {
		def = defaultBrokers
	}
	fs.StringVar(&a.brokers, "brokers", def, "comma-separated host:port list of nodes to contact (env RUNNEL_BROKERS)")
	fs.DurationVar(&a.timeout, "timeout", defaultAdminTimeout, "how long admin and metadata calls may take, retries included")
}

// newAdmin opens an Admin client with the --timeout.
func (a *app) newAdmin(brokers []string) (*client.Admin, error) {
	if a.timeout <= 0 {
		return nil, &usageError{errors.New("--timeout must be positive")}
	}
	adm, err := client.NewAdmin(brokers, client.WithRequestTimeout(a.timeout), client.WithClientID("runnel-cli"))
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	return adm, nil
}

// brokerList splits the --brokers value into addresses.
func (a *app) brokerList() ([]string, error) {
	var out []string
	for _, b := range strings.Split(a.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			// A malformed address would only fail later, after the client's retries, as a resolver
			// error: say so at once.
			if host, port, err := net.SplitHostPort(b); err != nil || host == "" || port == "" {
				return nil, &usageError{fmt.Errorf("--brokers: %q is not a host:port address (e.g. 127.0.0.1:7070)", b)}
			}
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, &usageError{errors.New("--brokers (or RUNNEL_BROKERS) names no address")}
	}
	return out, nil
}

// args returns a cobra argument check that reports a wrong count as a usage error.
func args(min, max int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) < min || (max >= 0 && len(a) > max) {
			hint := ""
			if max >= 0 && len(a) > max {
				hint = optionalValueHint(cmd, a[max])
			}
			return &usageError{fmt.Errorf("%s: expected %s, got %d argument(s)%s\nUsage: %s", cmd.CommandPath(), what, len(a), hint, cmd.UseLine())}
		}
		return nil
	}
}

// optionalValueHint explains a surplus argument that was likely meant as the value of a flag whose
// value is optional (such as bench produce's --keys): pflag takes such a value only after "=", so
// "--keys 500" sets --keys to its default and leaves 500 as an argument. Empty when no such flag was
// given at its default.
func optionalValueHint(cmd *cobra.Command, arg string) string {
	hint := ""
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if hint == "" && f.NoOptDefVal != "" && f.Value.String() == f.NoOptDefVal {
			hint = fmt.Sprintf(" (--%s takes a value only after \"=\": --%s=%s)", f.Name, f.Name, arg)
		}
	})
	return hint
}

// groupArgs rejects arguments to a command that only groups sub-commands: they name an unknown verb.
func groupArgs(cmd *cobra.Command, a []string) error {
	if len(a) > 0 {
		return &usageError{fmt.Errorf("unknown command %q for %q", a[0], cmd.CommandPath())}
	}
	return nil
}

// groupRun prints the help of a command group called without a sub-command.
func groupRun(cmd *cobra.Command, _ []string) error { return cmd.Help() }

// describeError renders err for people: Runnel errors read "CODE: message" (the wire error code and
// what went wrong), wrapped in what the CLI was doing. When the node looks unreachable it adds a hint.
func describeError(err error, brokers string) string {
	msg := err.Error()
	var re *rerr.Error
	if !errors.As(err, &re) {
		return msg
	}
	// A broker message may repeat its code ("CODE: CODE: what"); say it once.
	code := re.Code.String() + ": "
	msg = strings.ReplaceAll(msg, code+code, code)
	switch re.Code {
	case runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, runnelv1.ErrorCode_REQUEST_TIMED_OUT:
		if (strings.Contains(re.Message, "connect") || strings.Contains(re.Message, "Unavailable") ||
			strings.Contains(re.Message, "DeadlineExceeded")) && !strings.Contains(re.Message, "controller") {
			if brokers == "" {
				brokers = defaultBrokers
			}
			msg += fmt.Sprintf("\n  hint: is a node running at %s? Start one with 'runnel dev' (or 'make run'), or point --brokers / RUNNEL_BROKERS at it.", brokers)
		}
	}
	return msg
}
