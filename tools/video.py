"""Episodes as MP4 videos: --mode=test --video_dir and the evaluator's --eval_video_every.

Frame i of an episode's video is the screen the policy acted on at the episode's step i, so a
video has exactly as many frames as the episode has agent steps (its length in the log and in
test_results.json); the screen after the last step, which no action followed, is left out (the
envs start the next game at once, so it is not there to show). One screen per agent step: on
Atari a step is 4 emulator frames, so the video plays at 60 / 4 = 15 fps, the game's own speed;
other envs play at the render_fps of their metadata (CartPole 50), 30 where it has none.

Frames go to ffmpeg (imageio's ffmpeg plugin, libx264, yuv420p) as they come, so no episode is
held in memory. yuv420p needs an even width and height: a screen of odd size gets its last row or
column repeated (Atari's 210x160, classic control's 600x400 and MuJoCo's 480x480 are even, and
are kept as they are). A video is written under a hidden name (.episode_001.part.mp4) and renamed
when its episode ends; an interrupted one is deleted (abort), so a file of the finished name is
always whole."""
import os
import time
from typing import NamedTuple

import numpy as np

ATARI_FPS = 15  # the emulator's 60 frames a second, 4 of them an agent step
DEFAULT_FPS = 30


class VideoDirError(ValueError):
    """A folder that cannot hold videos; the message says why."""


class Written(NamedTuple):
    path: str
    frames: int
    fps: float
    nbytes: int
    wall_s: float  # from start() to the file's rename: the episode's play and its recording

    def line(self):
        return "wrote %s (%d frames, %.1f s at %g fps, %.0f kB; played and written in %.1f s)" % (
            self.path, self.frames, self.frames / self.fps, self.fps, self.nbytes / 1e3, self.wall_s)


def fps_for(is_atari, metadata):
    """The frame rate of an env's videos: the game's speed at one screen per agent step."""
    if is_atari:
        return ATARI_FPS
    fps = (metadata or {}).get("render_fps")
    return fps if isinstance(fps, (int, float)) and fps > 0 else DEFAULT_FPS


def prepare_dir(path):
    """Makes the folder for videos, or raises VideoDirError saying why it cannot be one."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise VideoDirError("%s is a file, not a folder" % path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise VideoDirError("cannot make the folder %s (%s)" % (path, e.strerror or e))
    if not os.access(path, os.W_OK | os.X_OK):
        raise VideoDirError("the folder %s is not writable" % path)


def even(frame):
    """The frame with an even height and width, its last row or column repeated where needed."""
    h, w = frame.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return frame
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")


class EpisodeVideo:
    """One MP4 at a time: start(path), add(frame) for each step's RGB screen [H, W, 3] uint8,
    close() at the episode's end (the file appears under its name), abort() to drop it."""

    def __init__(self, fps):
        self.fps, self.path, self.frames = fps, None, 0
        self._writer, self._tmp, self._t0 = None, None, None

    @property
    def recording(self):
        return self.path is not None

    def start(self, path):
        self.abort()
        self.path, self.frames, self._t0 = path, 0, time.time()
        folder, name = os.path.split(path)
        self._tmp = os.path.join(folder, "." + os.path.splitext(name)[0] + ".part.mp4")

    def add(self, frame):
        if self._writer is None:
            import imageio.v2 as imageio
            # macro_block_size=1: keep the screen's size (imageio would scale 210 rows up to 224)
            self._writer = imageio.get_writer(self._tmp, fps=self.fps, codec="libx264", macro_block_size=1,
                                              ffmpeg_log_level="error")
        self._writer.append_data(even(np.asarray(frame, np.uint8)))
        self.frames += 1

    def close(self):
        """Finishes the file; returns its Written, or None for an episode without frames."""
        if self._writer is None:
            self.abort()
            return None
        self._writer.close()
        self._writer = None
        os.replace(self._tmp, self.path)
        done = Written(self.path, self.frames, self.fps, os.path.getsize(self.path), time.time() - self._t0)
        self.path = None
        return done

    def abort(self):
        """Drops the video under way, if any (a Ctrl-C may have ended ffmpeg already)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # a broken pipe to a stopped ffmpeg: the file goes anyway
                pass
            self._writer = None
        if self._tmp is not None and os.path.exists(self._tmp):
            os.remove(self._tmp)
        self.path = None


class EpisodeVideos:
    """Episodes one after another as folder/episode_001.mp4, episode_002.mp4, ...: add() each
    step's screen (the first of an episode starts its file), end() at each episode's end, which
    logs the file written."""

    def __init__(self, folder, fps, log, name="episode_%03d.mp4"):
        self.folder, self.name, self.log, self.count = folder, name, log, 0
        self.video = EpisodeVideo(fps)

    def add(self, frame):
        if not self.video.recording:
            self.count += 1
            self.video.start(os.path.join(self.folder, self.name % self.count))
        self.video.add(frame)

    def end(self):
        written = self.video.close()
        if written is not None:
            self.log(written.line())
        return written

    def abort(self):
        self.video.abort()
