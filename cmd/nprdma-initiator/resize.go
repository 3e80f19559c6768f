package main

// noteResized follows the namespace when the target grew it: the fuse mode
// grows its FUSE file and loop device (a mounted file system can then be
// grown, resize2fs); an NBD export keeps the size its clients negotiated
// (NBD has no way to tell them) until the next attach. The record says the
// size served.
func (a *attachment) noteResized() {
	size := a.ns.Size()
	if a.fuse == nil {
		a.say("%s: the target grew the namespace to %s; the NBD export stays %s until it is attached again", a.req.name, humanSize(size), humanSize(a.rec.Size))
		return
	}
	if err := a.fuse.Resize(); err != nil {
		a.say("%s: the target grew the namespace to %s, but the device could not follow: %v", a.req.name, humanSize(size), err)
		return
	}
	a.rec.Size = size
	if err := a.req.dir.Save(a.rec); err != nil {
		a.say("%v", err)
	}
	a.say("%s: the target grew the namespace: %s is %s now", a.req.name, a.rec.LoopDevice, humanSize(size))
}
