package receiver

import "fmt"

// Error is an operation's failure phrased for people.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

func userErrorf(format string, args ...any) error { return &Error{Msg: fmt.Sprintf(format, args...)} }

// internal logs err and returns an error for people that points at the log.
func (p *Pipeline) internal(app, what string, err error) error {
	p.logger().Error(what, "app", app, "err", err)
	return userErrorf("%s for app %s failed; the server log has details", what, app)
}
