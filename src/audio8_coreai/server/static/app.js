// The page of `audio8 serve`: the voice list and upload (/v1/voices), speech played as it streams and then
// offered whole (/v1/audio/speech, stream: true, wav). Plain JS, no build step, nothing loaded from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const LEAD_S = 0.05; // the first chunk starts this far ahead of now, so it is scheduled whole

// ---------------------------------------------------------------------------------------------------------
// Messages

function show(element, text) {
  element.textContent = text;
  element.hidden = !text;
}

// An API refusal as { message, code }: the message in the page's words where the API's name its parameters
// (OpenAI's {"error": {"message", "code"}}, else the body's text, else the status), the code the API's (or null).
async function refusal(response) {
  const text = await response.text();
  let error = {};
  try {
    error = JSON.parse(text).error ?? {};
  } catch (e) {
    // not our JSON (a proxy's page, say): its text below
  }
  const code = error.code ?? null;
  const wait = response.headers.get("Retry-After");
  if (response.status === 503 && wait) {
    const why = code === "shutting_down" ? "The server is shutting down" : "The server is busy";
    return { message: `${why}: try again in ${wait} s.`, code };
  }
  const own = {
    voice_exists: `A voice of that name is stored already: choose another name, or tick "Replace a stored voice of that name".`,
    voice_not_found: "That voice is no longer on the server (deleted since the list was read): pick another.",
  }[code];
  const said = text.trim().slice(0, 300) || `the server answered ${response.status} ${response.statusText}`;
  return { message: own ?? error.message ?? said, code };
}

// A failure to reach the server (fetch's TypeError), told apart from an error of the page's own.
class Unreachable extends Error {}

// What `promise` (a fetch, or a read of its answer) gives, a network failure thrown as an Unreachable that says
// `what` failed; a Stop (AbortError) is thrown as it is.
async function reach(promise, what) {
  try {
    return await promise;
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new Unreachable(`${what} (${e.message}): is audio8 serve still running?`);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Voices

async function loadVoices(select) {
  const picker = $("voice");
  const keep = select ?? picker.value;
  let response;
  try {
    response = await reach(fetch("/v1/voices"), "Could not reach the server");
  } catch (e) {
    show($("error"), e.message);
    return;
  }
  if (!response.ok) {
    show($("error"), `The voice list could not be read: ${(await refusal(response)).message}`);
    return;
  }
  const voices = (await response.json()).data;
  picker.length = 1; // the model's own voice stays first
  for (const v of voices) {
    const option = new Option(v.error ? `${v.name} (damaged)` : `${v.name} (${v.duration_s.toFixed(1)} s)`, v.name);
    option.disabled = Boolean(v.error);
    option.title = v.error ?? v.transcript;
    picker.add(option);
  }
  picker.value = voices.some((v) => v.name === keep && !v.error) ? keep : "";
  picker.dataset.loaded = String(voices.length);
  $("voice-count").textContent = voices.length === 1 ? "1 stored voice" : `${voices.length} stored voices`;
}

async function addVoice(event) {
  event.preventDefault();
  const form = $("voice-form");
  const error = $("voice-error");
  const status = $("voice-status");
  show(error, "");
  status.textContent = "";
  const name = $("voice-name").value.trim();
  const missing = [
    [!name, "a name"],
    [!$("voice-clip").files.length, "a clip"],
    [!$("voice-transcript").value.trim(), "the clip's transcript"],
  ].filter(([absent]) => absent).map(([, what]) => what);
  if (missing.length) {
    show(error, `Give ${missing.join(", ")} to add a voice.`);
    return;
  }
  const body = new FormData(form);
  body.set("name", name);
  const stored = [...$("voice").options].some((o) => o.value.toLowerCase() === name.toLowerCase());
  $("add-voice").disabled = true;
  status.textContent = "Encoding the clip…";
  try {
    const response = await reach(fetch("/v1/voices", { method: "POST", body }), "Could not reach the server");
    if (!response.ok) {
      status.textContent = "";
      show(error, (await refusal(response)).message);
      return;
    }
    const voice = await response.json();
    const warnings = voice.warnings.length ? ` Note: ${voice.warnings.join(" ")}` : "";
    const done = stored ? "Replaced" : "Added";
    status.textContent = `${done} the voice ${voice.name} (${voice.duration_s.toFixed(1)} s).${warnings}`;
    await loadVoices(voice.name);
  } catch (e) {
    status.textContent = "";
    show(error, e instanceof Unreachable ? e.message : `The voice could not be added: ${e.message}`);
  } finally {
    $("add-voice").disabled = false;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Speech: a streamed wav read as it comes

// The fields of a wav header (RIFF chunks up to "data"), or null while more bytes are needed. Throws for a
// wav that is not 16-bit PCM.
function wavHeader(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const tag = (at) => String.fromCharCode(...bytes.subarray(at, at + 4));
  if (bytes.length < 12) return null;
  if (tag(0) !== "RIFF" || tag(8) !== "WAVE") throw new Error("the server's answer is not a wav file");
  let at = 12;
  let format = null;
  while (at + 8 <= bytes.length) {
    const size = view.getUint32(at + 4, true);
    if (tag(at) === "data") {
      if (!format) throw new Error("the wav has no format chunk before its data");
      return { ...format, dataOffset: at + 8 };
    }
    if (at + 8 + size > bytes.length) return null;
    if (tag(at) === "fmt ") {
      format = { channels: view.getUint16(at + 10, true), rate: view.getUint32(at + 12, true) };
      if (view.getUint16(at + 8, true) !== 1 || view.getUint16(at + 22, true) !== 16) {
        throw new Error("the wav is not 16-bit PCM");
      }
    }
    at += 8 + size + (size % 2);
  }
  return null;
}

// Plays 16-bit PCM frames as they arrive, each chunk scheduled right after the last; `idle` is called when the
// last chunk scheduled has ended (or been stopped).
class Player {
  constructor(context, header, idle) {
    this.context = context;
    this.header = header;
    this.idle = idle;
    this.next = 0;
    this.sources = new Set();
  }

  get playing() {
    return this.sources.size > 0;
  }

  play(pcm) {
    const { channels, rate } = this.header;
    const frames = pcm.length / 2 / channels;
    const view = new DataView(pcm.buffer, pcm.byteOffset, pcm.byteLength);
    const buffer = this.context.createBuffer(channels, frames, rate);
    for (let c = 0; c < channels; c++) {
      const out = buffer.getChannelData(c);
      for (let i = 0; i < frames; i++) out[i] = view.getInt16((i * channels + c) * 2, true) / 32768;
    }
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    this.next = Math.max(this.next, this.context.currentTime + LEAD_S);
    source.start(this.next);
    this.next += buffer.duration;
    this.sources.add(source);
    source.onended = () => {
      this.sources.delete(source);
      if (!this.playing) this.idle();
    };
    return frames;
  }

  stop() {
    for (const source of this.sources) source.stop();
  }
}

// The received bytes as one wav file: the streamed header's sizes say "unknown" (0xFFFFFFFF), set them.
function wholeWav(chunks, length, header) {
  const bytes = new Uint8Array(length);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.length;
  }
  const view = new DataView(bytes.buffer);
  view.setUint32(4, length - 8, true);
  view.setUint32(header.dataOffset - 4, length - header.dataOffset, true);
  return new Blob([bytes], { type: "audio/wav" });
}

// The request body from the form, or a message saying what to change.
function speechRequest() {
  const input = $("text").value;
  if (!input.trim()) return { problem: "Type some text to speak: the text box is empty." };
  const body = { input, response_format: "wav", stream: true };
  if ($("voice").value) body.voice = $("voice").value;
  const seed = $("seed").value.trim();
  if (seed || $("seed").validity.badInput) {
    if (!/^\d+$/.test(seed)) return { problem: "The seed must be a whole number of 0 or more, or empty." };
    body.seed = Number(seed);
  }
  const temperature = $("temperature").value.trim();
  if (temperature || $("temperature").validity.badInput) {
    body.temperature = Number(temperature);
    if (!(body.temperature > 0)) return { problem: "The temperature must be a number above 0, or empty." };
  }
  return { body };
}

let context = null; // one AudioContext for the page, made on the first Speak (a user gesture)
let speech = null; // { controller, player, receiving } of the last Speak: its request, then its audio as it plays

function setState(state, samples) {
  const result = $("result");
  result.dataset.state = state;
  if (samples !== undefined) result.dataset.samples = String(samples);
}

// Speak enabled unless a request is being received; Stop while one is, or its audio still plays. A button
// disabled while it has the focus hands the focus to the other (a keyboard user's place is kept).
function setButtons() {
  const speakButton = $("speak");
  const stopButton = $("stop");
  const busy = Boolean(speech?.receiving);
  const stoppable = busy || Boolean(speech?.player?.playing);
  const focused = document.activeElement;
  speakButton.disabled = busy;
  stopButton.disabled = !stoppable;
  if (focused === speakButton && busy) stopButton.focus();
  if (focused === stopButton && !stoppable) speakButton.focus();
}

// Stops the last Speak: its request (the server stops making the speech at its next frame) and its audio.
function stopSpeech() {
  if (!speech) return;
  speech.controller.abort();
  speech.player?.stop();
  speech = null;
  setButtons();
}

async function speak(event) {
  event.preventDefault();
  if (speech?.receiving) return; // a second click before the first one's request started
  const status = $("status");
  show($("error"), "");
  const { body, problem } = speechRequest();
  if (problem) {
    status.textContent = "";
    show($("error"), problem);
    setState("error");
    return;
  }
  stopSpeech(); // the last Speak's audio, if it still plays
  const controller = new AbortController();
  const current = { controller, player: null, receiving: true };
  speech = current;
  setButtons();
  $("result").hidden = true;
  setState("waiting", 0);
  status.textContent = "Waiting for the first audio…";
  try {
    context = context ?? new AudioContext();
    await context.resume();
    const request = fetch("/v1/audio/speech", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    const response = await reach(request, "Could not reach the server");
    if (!response.ok) {
      status.textContent = "";
      const refused = await refusal(response);
      show($("error"), refused.message);
      setState("error");
      if (refused.code === "voice_not_found") loadVoices(); // a voice deleted since the list was read leaves it
      return;
    }
    const seed = response.headers.get("X-Seed");
    const chunks = [];
    let length = 0;
    let header = null;
    let pending = new Uint8Array(0); // received, not yet played: the header until it is whole, then odd bytes
    let samples = 0;
    const reader = response.body.getReader();
    setState("streaming");
    for (;;) {
      const { done, value } = await reach(reader.read(), "The connection to the server was lost");
      if (done) break;
      chunks.push(value);
      length += value.length;
      pending = join(pending, value);
      if (!header) {
        header = wavHeader(pending);
        if (!header) continue;
        current.player = new Player(context, header, () => speech === current && setButtons());
        pending = pending.subarray(header.dataOffset);
      }
      const frameBytes = 2 * header.channels;
      const ready = pending.length - (pending.length % frameBytes);
      if (ready > 0) {
        samples += current.player.play(pending.subarray(0, ready));
        pending = pending.subarray(ready);
        setState("streaming", samples);
        status.textContent = `Playing as it arrives: ${(samples / header.rate).toFixed(2)} s received…`;
      }
    }
    if (!header || samples === 0) {
      status.textContent = "";
      show(
        $("error"),
        "The model ended the utterance at once: there is no audio. Speak again with another seed or none."
      );
      setState("error", 0);
      return;
    }
    const download = $("download");
    URL.revokeObjectURL(download.href);
    download.href = URL.createObjectURL(wholeWav(chunks, length, header));
    $("player").src = download.href;
    $("result").hidden = false;
    setState("done", samples);
    status.textContent = `Done: ${(samples / header.rate).toFixed(2)} s of speech at ${header.rate} Hz, seed ${seed}.`;
  } catch (e) {
    if (speech !== current && speech !== null) return; // stopped, and a new Speak has begun: the page is its
    if (e.name === "AbortError") {
      status.textContent = "Stopped.";
      setState("stopped");
    } else {
      status.textContent = "";
      show($("error"), e instanceof Unreachable ? e.message : `The speech could not be played: ${e.message}`);
      setState("error");
    }
  } finally {
    current.receiving = false;
    if (speech === current) setButtons();
  }
}

// `a` then `b` in one array.
function join(a, b) {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

document.addEventListener("DOMContentLoaded", () => {
  $("speak-form").addEventListener("submit", speak);
  $("stop").addEventListener("click", stopSpeech);
  $("voice-form").addEventListener("submit", addVoice);
  loadVoices();
});
